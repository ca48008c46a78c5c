"""Trainer 0 decides, every trainer follows: ``Trainer.broadcast`` and ``Trainer.scale_learning_rate``.

Both are called by every trainer at the same point of the script (after an epoch's batch loop,
say). A broadcast is a barrier that carries trainer 0's value (server 0 keeps it with the
barrier's count: server/services/trainer_barrier.py; collective mode: the gloo group), so it counts with
the trainer's barriers and is saved with them in a checkpoint's position. A learning-rate change
goes from trainer 0 to every server (server/services/learning_rates.py) and, where the dense update runs
on the trainers (collective, hybrid), into each trainer's own rule.

A rollback after the batch loop makes these calls void until the loop replays the epoch (as
``Trainer.barrier``, TrainerProgress.roll_back_outside_loop in trainer/progress.py): the epoch's code runs again, and these calls with it.
"""
from __future__ import annotations

from paramshard import json_value
from paramshard.errors import ConfigError, ParamshardError
from paramshard.optim import check_lr_factor


def broadcast(trainer, value, name: str, timeout: float | None):
    if trainer.closed:
        raise ConfigError("Trainer.broadcast after close()")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"broadcast name must be a non-empty str, got {name!r}")
    if trainer.is_chief:
        json_value.encoded(value)       # the chief's mistake is its own ConfigError, in every mode
    progress = trainer.progress
    if progress.replay_pending or trainer.env.num_trainers == 1:
        # Void (the epoch runs again), or nobody to tell: the value as given.
        return value
    try:
        return progress.meet(name, lambda count, resumed: trainer.backend.broadcast(name, count, value, timeout,
                                                                                   resumed))
    except ParamshardError as exc:
        progress.roll_back_outside_loop(exc)
        return value


def table_names(trainer, tables) -> list[str]:
    """``tables`` of scale_learning_rate as names: True every table, False none, or names."""
    if tables is True:
        return list(trainer.tables)
    if tables is False or tables is None:
        return []
    names = [tables] if isinstance(tables, str) else list(tables)
    unknown = [n for n in names if n not in trainer.tables]
    if unknown:
        raise ConfigError(f"scale_learning_rate(tables={tables!r}): no SparseEmbedding named {unknown[0]!r} in "
                          f"this model (tables: {sorted(trainer.tables) or 'none'})")
    return list(dict.fromkeys(names))


def scale_learning_rate(trainer, factor, tables, dense: bool) -> None:
    if trainer.closed:
        raise ConfigError("Trainer.scale_learning_rate after close()")
    factor = check_lr_factor(factor, "Trainer.scale_learning_rate")
    if not isinstance(dense, bool):
        raise ConfigError(f"scale_learning_rate(dense={dense!r}): True or False")
    names = table_names(trainer, tables)
    if not dense and not names:
        raise ConfigError("scale_learning_rate(dense=False) with no table: nothing to change")
    if trainer.progress.replay_pending:
        return          # void: the epoch runs again and calls it again
    try:
        trainer.backend.scale_learning_rate(factor, dense, names, trainer.step_count)
    except ParamshardError as exc:
        trainer.progress.roll_back_outside_loop(exc)
