"""Where a trainer is in its data, so that a rollback or a resume replays exactly the batches after
the checkpoint: ``for epoch in trainer.epochs(n): for batch in trainer.prefetching(loader): ...``.

Every batch of the loop is one ``trainer.step``, so the position is counted in steps: an epoch
starts at some step, and its batch ``b`` is trained at step ``start + b``. A rollback
(client/recovery.py) moves ``step_count`` back to the checkpoint's step; the batch iterator
then opens the loader again at ``step_count - start``. ``epochs()`` saves a checkpoint at the
start of every epoch (when the job keeps checkpoints), so the checkpoint a rollback goes back to
is never in an earlier epoch than the one being trained.

Re-opening a loader at batch ``b`` of its pass: a loader with ``state()`` and ``restore()``
(TabularReader, CriteoReader, LibsvmReader) is told its pass and the batches to skip (inside
``epochs()`` its pass is the epoch number, so its shuffle is the same after a resume); any other
iterable is iterated again from its start and ``b`` batches are skipped, which is exact when it
yields the same batches every time it is iterated (a list, a seeded reader).

What the position holds is saved with every checkpoint (``as_json``) and read back on resume, so
``--resume`` and a whole-job restart go on in the epoch and at the batch where the checkpoint was.
"""
from __future__ import annotations

import itertools
from typing import Iterable, Iterator, Protocol, TypeGuard

from paramshard.errors import ConfigError


class PositionableLoader(Protocol):
    """A loader that says where it is and goes back there (TabularReader, DynamicShards, a stream)."""

    def __iter__(self) -> Iterator: ...

    def state(self) -> dict: ...

    def restore(self, state: dict) -> None: ...


def positionable(loader: object) -> TypeGuard[PositionableLoader]:
    """The loader can be put back at a batch of a pass without reading it from its start."""
    return callable(getattr(loader, "state", None)) and callable(getattr(loader, "restore", None))


class LoopPosition:
    """The epoch being trained, the step it started at, and the loader's pass number in it."""

    def __init__(self):
        self.epoch: int | None = None       # None: not inside trainer.epochs()
        self.start_step: int | None = None  # the step of the current pass's first batch
        self.loader_pass: int | None = None  # the loader's own pass number (state()["epoch"])
        self.barrier_counts: dict[str, int] = {}   # the trainer's barrier counts at the pass's start

    @property
    def active(self) -> bool:
        return self.start_step is not None or self.epoch is not None

    def as_json(self, step: int, barrier_counts: dict[str, int]) -> dict | None:
        """The position at ``step`` (a checkpoint's), with the trainer's barrier counts then."""
        if not self.active:
            return None
        batch = step - self.start_step if self.start_step is not None else 0
        return {"epoch": self.epoch, "batch": batch, "loader_pass": self.loader_pass,
                "barrier_counts": dict(barrier_counts)}

    def load(self, saved: dict | None, step: int) -> None:
        """Back to what a checkpoint's position says (``step``: the checkpoint's step)."""
        if not saved:
            return
        try:
            epoch, batch = saved.get("epoch"), int(saved["batch"])
            loader_pass = saved.get("loader_pass")
            counts = {str(k): int(v) for k, v in (saved.get("barrier_counts") or {}).items()}
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ConfigError(f"the checkpoint's loop position {saved!r} is malformed: expected "
                              f"{{'epoch', 'batch', 'loader_pass', 'barrier_counts'}}") from None
        if (epoch is not None and type(epoch) is not int) or batch < 0 or \
                (loader_pass is not None and type(loader_pass) is not int):
            raise ConfigError(f"the checkpoint's loop position {saved!r} is malformed")
        self.epoch, self.start_step, self.loader_pass = epoch, step - batch, loader_pass
        self.barrier_counts = counts

    def begin_epoch(self, epoch: int, step: int, barrier_counts: dict[str, int]) -> None:
        self.epoch, self.start_step, self.loader_pass = epoch, step, None
        self.barrier_counts = dict(barrier_counts)

    def batches(self, loader: Iterable, step: int, barrier_counts: dict[str, int]) -> Iterator:
        """The loader's batches from the one trained at ``step`` on."""
        if self.start_step is None:          # a pass outside epochs(), or the first of this epoch
            self.start_step = step
            self.barrier_counts = dict(barrier_counts)
        skip = step - self.start_step
        if skip < 0:
            raise ConfigError(f"step {step} is before the start of this pass (step {self.start_step}): a rollback "
                              f"went back past the start of the epoch; use trainer.epochs(), which saves a "
                              f"checkpoint at the start of every epoch")
        if positionable(loader):
            if self.epoch is not None:
                # In epochs(), pass e of the loader is epoch e: the same shuffle whether this
                # process trained the epochs before or resumed from a checkpoint.
                self.loader_pass = self.epoch
            if self.loader_pass is not None:
                # Back to this pass of the loader (a rollback or a resume): its own count says which.
                loader.restore({"epoch": self.loader_pass, "batches": skip})
                return iter(loader)
            iterator = iter(loader)
            self.loader_pass = _pass_of(loader)
            return itertools.islice(iterator, skip, None) if skip else iterator
        return itertools.islice(iter(loader), skip, None) if skip else iter(loader)

    def pass_ended(self) -> None:
        """A pass outside epochs() ended (exhausted, or the loop left early): the next one starts
        afresh. Inside epochs() the position stays until the next epoch begins: a rollback in
        the code after the batch loop (evaluation, barriers) replays this epoch's batches."""
        if self.epoch is None:
            self.start_step = None
            self.loader_pass = None


def _pass_of(loader) -> int | None:
    try:
        value = loader.state().get("epoch")
    except (AttributeError, TypeError):
        return None
    return value if type(value) is int else None
