"""StreamReader: a StreamSource as a trainer's batch loop, exactly once through checkpoints.

    from paramshard.data import StreamReader, open_stream
    source = open_stream(args.stream, trainer.trainer_id, trainer.env.num_trainers)
    reader = StreamReader(source, trainer, batch_size=512)     # seeks the resumed checkpoint's position
    for batch in trainer.prefetching(reader, convert=encode):   # or: for batch in reader
        ...                                                     # batch.records: a DataFrame (may be empty)
        trainer.step(loss)                                      # exactly one step per batch, in order
    trainer.close()             # its final checkpoint holds the position after the last batch trained
    reader.close()              # then the source (signal handlers call reader.stop())

How the position travels (the seam, the same path as the trainer's loop position,
trainer/loop.py): the reader registers itself as ``trainer.progress.stream``. Each batch it
hands out is labelled with the step that will train it (the trainer's step count then, plus the
batches handed out and not stepped on yet: one step per batch, in order, so a prefetching loop
that reads one ahead is counted right). Every checkpoint (trainer/checkpointing.py) saves
``position_at(step)``: the position after the last batch its step trained, never one read
ahead, under ``"stream"`` in the trainer's position file; once that file is written it calls
``saved(position)``, which ``commit``s it to the source (Kafka commits its offsets then). On
``--resume`` the reader ``seek``s the checkpoint's position before it reads; after a rollback
(a server restarted in place, ``--max-restarts``) it seeks the restored checkpoint's position
and drops what it had read ahead, so the steps trained again train the same records and none
is lost or repeated.

The loop ends when ``stop()`` is called (from any thread), when the trainer is asked to leave
(an elastic job's scale-down), or after ``idle_timeout`` seconds without a record (None: never).
While no record comes, each ``poll_timeout`` the loop yields an empty batch when
``empty_batches`` (default: in sync mode, where every trainer's step is a barrier the others wait
at; a loop steps on it with ``trainer.step()`` and no loss), else it polls again.

Not covered: a job that changes its number of trainers while it reads a stream (each rank's
position is its own share of the records; a position of another world is refused).
"""
from __future__ import annotations

import collections
import threading
import time

import pandas as pd

from paramshard.data.stream.source import StreamBatch
from paramshard.errors import ConfigError
from paramshard.log import get_logger

log = get_logger("data")


class StreamReader:
    def __init__(self, source, trainer, batch_size: int, poll_timeout: float = 1.0, idle_timeout: float | None = None,
                 empty_batches: bool | None = None):
        if batch_size < 1 or poll_timeout <= 0:
            raise ConfigError(f"StreamReader: batch_size {batch_size} must be >= 1 and poll_timeout {poll_timeout} > 0")
        progress = trainer.progress
        if getattr(progress, "stream", None) is not None:
            raise ConfigError(f"trainer {trainer.trainer_id} already reads a StreamReader: one stream per Trainer "
                              f"(its checkpoints hold one stream position)")
        self.source, self.trainer, self.batch_size = source, trainer, batch_size
        self.poll_timeout, self.idle_timeout = poll_timeout, idle_timeout
        if empty_batches is None:
            from paramshard.mode import Mode
            empty_batches = Mode.parse(trainer.env.mode).server_mode is Mode.SYNC
        self.empty_batches = empty_batches
        self._stop = threading.Event()
        self._closed = False
        self._start = source.position()      # where a rollback to before any checkpoint goes back to
        self._handed: collections.deque = collections.deque()    # (step that trains it, position after it)
        self._recoveries = trainer.recoveries
        self._go_to_checkpoint(resumed=True)
        progress.stream = self

    # -- what checkpoints call (trainer/checkpointing.py) ---------------------------------
    def position_at(self, step: int) -> dict:
        """The position after the last batch trained by step ``step`` or before."""
        while self._handed and self._handed[0][0] <= step:
            _, self._base = self._handed.popleft()
        return self._base

    def saved(self, position: dict) -> None:
        """A checkpoint holding ``position`` is written: the source may commit it."""
        if not self._closed:
            self.source.commit(position)

    # -- the loop (trainer/loop.py treats it as positionable: a rollback reopens it) -------
    def state(self) -> dict:
        return {"epoch": 0, "batches": 0}     # one endless pass; where in it is the stream position's

    def restore(self, state: dict) -> None:
        """The loop reopens the reader after a rollback: __iter__ seeks the checkpoint's position."""

    def stop(self) -> None:
        """End the loop after the batch being trained (thread-safe; a signal handler may call it)."""
        self._stop.set()

    def __iter__(self):
        self._check_rollback()
        return self._batches()

    def _batches(self):
        idle_since = time.monotonic()
        while not self._stop.is_set() and not getattr(self.trainer, "leave_requested", False):
            self._check_rollback()
            batch = self.source.poll(self.batch_size, self.poll_timeout)
            if batch is None:
                if self.idle_timeout is not None and time.monotonic() - idle_since >= self.idle_timeout:
                    return
                if not self.empty_batches:
                    continue
                batch = StreamBatch(pd.DataFrame(), self.source.position(), None)
            else:
                idle_since = time.monotonic()
            self._handed.append((self._next_step, batch.position))
            self._next_step += 1
            yield batch

    def close(self) -> None:
        """Close the source (after ``trainer.close()``, whose final checkpoint saves the position)."""
        if not self._closed:
            self._closed = True
            self.source.close()

    # -- resume and rollback ----------------------------------------------------------------
    def _check_rollback(self) -> None:
        recoveries = self.trainer.recoveries
        if recoveries != self._recoveries:
            self._recoveries = recoveries
            self._go_to_checkpoint(resumed=False)

    def _go_to_checkpoint(self, resumed: bool) -> None:
        """Read on from the position the trainer's checkpoint holds (a resume, or a rollback)."""
        trainer = self.trainer
        saved = (trainer.progress.position or {}).get("stream")
        step = trainer.step_count
        if saved is not None:
            self.source.seek(saved)
            self._base = saved
        elif step == 0:
            if not resumed:
                self.source.seek(self._start)     # rolled back to before any checkpoint: from the start
            self._base = self._start
        else:
            how = "resumes" if resumed else "rolled back"
            raise ConfigError(f"trainer {trainer.trainer_id} {how} at step {step}, but its checkpoint holds no stream "
                              f"position for it (a checkpoint of a job that did not read this stream, or its "
                              f"position file is not readable on this host): the records after it cannot be "
                              f"replayed exactly once; keep the checkpoint directory where every trainer reads it, "
                              f"or start the stream job afresh")
        self._handed.clear()
        self._next_step = step + 1
