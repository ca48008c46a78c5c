"""``Trainer.epochs(count)``: the epochs to train, from where the job is."""
from __future__ import annotations

from paramshard.errors import ConfigError, ParamshardError
from paramshard.trainer import checkpointing


def epochs(trainer, count: int):
    """1 to ``count``, from the epoch this job is in (trainer/loop.py). With checkpoints on,
    each epoch starts with one, so a rollback never goes back past the epoch's start; a
    rollback after the epoch's batch loop runs that epoch again from the checkpoint's batch."""
    if type(count) is not int or count < 0:
        raise ConfigError(f"epochs({count!r}): expected a whole number of epochs >= 0")
    progress = trainer.progress
    loop = progress.loop
    epoch = loop.epoch if loop.epoch is not None else 1
    resumed = loop.epoch is not None
    while epoch <= count:
        if not resumed:
            progress.begin_epoch(epoch)
            if checkpointing.unsaved(trainer):
                try:
                    trainer.save()      # a rollback never goes back past the start of the epoch
                except ParamshardError as exc:
                    progress.roll_back(exc)         # back into the epoch before: go on there
                    epoch, resumed = loop.epoch or epoch, True
                    continue
        yield epoch
        if getattr(trainer, "leave_requested", False):
            return          # asked to leave (trainer/leave_request.py): no further epoch
        # Rolled back after the batch loop: this epoch again, from the checkpoint's batch.
        resumed = progress.replay_pending
        if not resumed:
            epoch += 1
    progress.begin_epoch(epoch)   # a resume goes on from here


def start_at(trainer, epoch: int) -> None:
    """A trainer that joined a running job (``env.joining``) starts ``trainer.epochs()`` at
    ``epoch``, the job's, instead of 1: the script knows it (the CTR app: from the barrier counts
    the joiner goes on from, ``trainer.barrier_counts()``). No checkpoint is taken there: the
    job's own is the epoch's."""
    if type(epoch) is not int or epoch < 1:
        raise ConfigError(f"start_at({epoch!r}): epochs count from 1")
    if not trainer.env.joining:
        raise ConfigError("start_at: only a trainer that joined a running job starts at another epoch than "
                          "where its job is (a resume goes on from the checkpoint's)")
    trainer.progress.begin_epoch(epoch)
