"""This process's Trainers: the one ``paramshard.barrier()`` means, and closing a
Trainer the script forgot to close when the interpreter exits."""
from __future__ import annotations

import sys
import weakref
from typing import TYPE_CHECKING

from paramshard.errors import ConfigError
from paramshard.log import get_logger

if TYPE_CHECKING:
    from paramshard.trainer.trainer import Trainer

log = get_logger("trainer")

# A leave at interpreter exit must not hold the script up when the servers are gone.
EXIT_CLOSE_TIMEOUT = 3.0
_made: list = []     # weak references to this process's Trainers, oldest first (paramshard.barrier)


def current_trainer() -> "Trainer":
    """The most recently built Trainer of this process that is not closed."""
    for ref in reversed(_made):
        trainer = ref()
        if trainer is not None and not trainer.closed:
            return trainer
    raise ConfigError("paramshard.barrier() needs an open Trainer in this process: build "
                      "ps.Trainer(model) first (or call trainer.barrier() on the one you have)")


def _close_at_exit(ref: "weakref.ref[Trainer]") -> None:
    trainer = ref()
    if trainer is None or trainer.closed:
        return
    if getattr(sys, "last_value", None) is not None:
        return      # the script died of an exception: the servers should see a death, not a leave
    log.warning("trainer %d: close() was not called; closing at exit "
                "(use `with ps.Trainer(...) as trainer:` or call trainer.close())", trainer.trainer_id)
    try:
        trainer.close(timeout=EXIT_CLOSE_TIMEOUT)
    except Exception as exc:      # servers already gone: nothing left to tell them
        log.debug("trainer %d: close at exit failed: %s", trainer.trainer_id, exc)


def remember(trainer) -> None:
    """``trainer`` is the newest of this process (references to collected ones are dropped)."""
    _made[:] = [r for r in _made if r() is not None] + [weakref.ref(trainer)]
