"""One trainer backend per mode (base.py: the contract), chosen once from ``env.mode``."""
from __future__ import annotations

from typing import Protocol

from paramshard.env import ClusterEnv
from paramshard.mode import Mode
from paramshard.trainer.backends.base import TrainerBackend

# Imported when chosen: collective mode needs torch.distributed, the others do not.
_BACKENDS = {
    Mode.SYNC: "servers:ServerBackend",
    Mode.ASYNC: "servers:ServerBackend",
    Mode.COLLECTIVE: "collective:CollectiveBackend",
    Mode.HYBRID: "hybrid:HybridBackend",
    Mode.GEO: "geo:GeoBackend",
}


class BackendClass(Protocol):
    """A backend class as ``open_backend`` calls it: ``connect`` with keywords, each taking the ones
    it needs (``**_`` for the others)."""

    def connect(self, env: ClusterEnv, *, model, params, optimizer, max_in_flight: int,
                find_unused_parameters: bool) -> TrainerBackend: ...


def backend_class(mode: Mode) -> BackendClass:
    """The backend class of ``mode``."""
    import importlib
    module, _, name = _BACKENDS[Mode.parse(mode)].partition(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def open_backend(env: ClusterEnv, model, params, optimizer, max_in_flight: int,
                 find_unused_parameters: bool = False) -> TrainerBackend:
    """Connect this trainer to the job as its mode says (servers, the trainers' group, or both).
    The configuration must have been validated first (trainer/trainer_config.py): this joins things."""
    cls = backend_class(env.mode)
    return cls.connect(env, model=model, params=params, optimizer=optimizer, max_in_flight=max_in_flight,
                       find_unused_parameters=find_unused_parameters)


__all__ = ["TrainerBackend", "backend_class", "open_backend"]
