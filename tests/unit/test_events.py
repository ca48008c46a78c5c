"""events.py: the listener registries the core calls instead of importing observe/."""
import pytest

from paramshard import events


class _Spy:
    def __init__(self, name, log, fail=False):
        if fail:
            raise RuntimeError(f"{name} cannot start")
        self.name, self.log = name, log

    def after_step(self, step, loss, pipeline, staleness):
        self.log.append((self.name, "step", step))

    def close(self, *code):
        self.log.append((self.name, "close", *code))


@pytest.fixture
def no_defaults(monkeypatch):
    """Only the listeners a test registers (not observe's, which would read the environment)."""
    monkeypatch.setattr(events, "_trainer_factories", [])
    monkeypatch.setattr(events, "_server_factories", [])


def test_trainer_listeners_are_called_in_order_and_closed_in_reverse(no_defaults):
    log = []
    events.register_trainer_listener(lambda env, model: _Spy("a", log))
    events.register_trainer_listener(lambda env, model: None)         # a factory may decline
    events.register_trainer_listener(lambda env, model: _Spy("b", log))
    listeners = events.TrainerListeners(env=None, model=None)
    assert [x.name for x in listeners.listeners] == ["a", "b"]
    listeners.after_step(3, None, {}, None)
    listeners.close()
    assert log == [("a", "step", 3), ("b", "step", 3), ("b", "close"), ("a", "close")]
    assert listeners.find(_Spy) is None                                # closed: none left


def test_a_listener_that_fails_to_start_closes_those_started_before_it(no_defaults):
    log = []
    events.register_server_listener(lambda env, server: _Spy("a", log))
    events.register_server_listener(lambda env, server: _Spy("b", log, fail=True))
    with pytest.raises(RuntimeError, match="b cannot start"):
        events.ServerListeners(env=None, server=None)
    assert log == [("a", "close", None)]             # None: the server never served, record nothing


def test_server_listeners_hear_the_exit_code(no_defaults):
    log = []
    factory = lambda env, server: _Spy("s", log)    # noqa: E731
    events.register_server_listener(factory)
    events.ServerListeners(env=None, server=None).close(3)
    events.unregister_server_listener(factory)
    events.ServerListeners(env=None, server=None).close(0)
    assert log == [("s", "close", 3)]


def test_observe_registers_from_the_top_and_events_names_none_of_it(monkeypatch):
    """paramshard/__init__.py (imported first by every process) registers observe/'s watches;
    events.py itself starts with empty registries and names nothing of observe/."""
    import inspect

    import paramshard
    assert events._trainer_factories == [paramshard._trainer_watch, paramshard._delta_start]   # and a delta dir's files
    assert events._server_factories == [paramshard._server_watch]
    assert "paramshard.observe" not in inspect.getsource(events)
    from paramshard.observe.live import server_watch, trainer_watch
    made = []
    monkeypatch.setattr(trainer_watch, "TrainerWatch", lambda env, model: made.append(("trainer", env, model)))
    monkeypatch.setattr(server_watch, "ServerWatch", lambda env, server: made.append(("server", env, server)))
    paramshard._trainer_watch("env", "model")
    paramshard._server_watch("env", "server")
    assert made == [("trainer", "env", "model"), ("server", "env", "server")]
