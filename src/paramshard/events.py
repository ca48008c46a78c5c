"""What a Trainer or a server process tells whoever watches it, without knowing who that is.

The core (trainer/, server/, runtime) does not import observe/: it calls the listeners
registered here, and this module names none of them. The top registers observe/'s (the run
directory's records, the /metrics endpoints): ``paramshard/__init__.py``, which every process
imports first, with factories that import observe/ only when a Trainer or a server starts.
A test or a user registers another (a step hook, a logger) the same way,
``register_trainer_listener`` / ``register_server_listener``.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol


class TrainerListener(Protocol):
    def after_step(self, step: int, loss: Any, pipeline: dict, staleness: int | None) -> None:
        """After each step: its number (the count after it), the loss tensor (or None), the
        step client's cumulative pipeline counters and the servers' staleness of the step."""

    def log(self, **values) -> None:
        """``Trainer.log(loss=..., epoch=..., auc=...)``."""

    def close(self) -> None:
        """The trainer closed (or failed to start): release what it holds."""

    # Optional: ``started(trainer)``, the Trainer has started (registered its model or restored
    # it): e.g. the chief writes the files a delta directory's followers need (inference/delta_start.py).


# A factory: (env, model) -> listener or None.
ListenerFactory = Callable[[Any, Any], "TrainerListener | None"]
_trainer_factories: list[ListenerFactory] = []


def register_trainer_listener(factory: ListenerFactory) -> None:
    """Every Trainer started from now on gets ``factory(env, model)`` as a listener."""
    _trainer_factories.append(factory)


def unregister_trainer_listener(factory: ListenerFactory) -> None:
    _trainer_factories.remove(factory)


class TrainerListeners:
    """Every registered listener of one Trainer, called in registration order."""

    def __init__(self, env, model):
        self.listeners: list[TrainerListener] = []
        try:
            for factory in _trainer_factories:
                listener = factory(env, model)
                if listener is not None:
                    self.listeners.append(listener)
        except BaseException:
            self.close()
            raise

    def find(self, kind: type):
        """The listener of this type, or None (e.g. the observe watch, for its /metrics)."""
        return next((x for x in self.listeners if isinstance(x, kind)), None)

    def started(self, trainer) -> None:
        for listener in self.listeners:
            started = getattr(listener, "started", None)
            if started is not None:
                started(trainer)

    def after_step(self, step: int, loss, pipeline: dict, staleness: int | None) -> None:
        for listener in self.listeners:
            listener.after_step(step, loss, pipeline, staleness)

    def log(self, **values) -> None:
        for listener in self.listeners:
            listener.log(**values)

    def close(self) -> None:
        for listener in reversed(self.listeners):
            listener.close()
        self.listeners = []


# -- server processes ---------------------------------------------------------------------------
class ServerListener(Protocol):
    """Watches one server process (``runtime.serve``). The server's loop is single-threaded
    and owns its counters: a listener reads ``server.cached_stats()`` while it serves and
    ``server.snapshot_stats()`` only in ``close`` (the loop has stopped by then)."""

    def close(self, exit_code: int | None) -> None:
        """The server stopped with ``exit_code``; None: it never served (a later listener
        failed to start), so release what is held and record nothing."""


# A factory: (env, server) -> listener or None.
ServerListenerFactory = Callable[[Any, Any], "ServerListener | None"]
_server_factories: list[ServerListenerFactory] = []


def register_server_listener(factory: ServerListenerFactory) -> None:
    """Every server process started from now on gets ``factory(env, server)`` as a listener."""
    _server_factories.append(factory)


def unregister_server_listener(factory: ServerListenerFactory) -> None:
    _server_factories.remove(factory)


class ServerListeners:
    """Every registered listener of one server process, started in registration order."""

    def __init__(self, env, server):
        self.listeners: list[ServerListener] = []
        try:
            for factory in _server_factories:
                listener = factory(env, server)
                if listener is not None:
                    self.listeners.append(listener)
        except BaseException:
            self.close(None)
            raise

    def close(self, exit_code: int | None) -> None:
        for listener in reversed(self.listeners):      # the last started stops first
            listener.close(exit_code)
        self.listeners = []
