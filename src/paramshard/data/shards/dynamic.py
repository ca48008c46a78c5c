"""DynamicShards: a loader that takes its data from the job's data-shard service
(server/elastic/shard_service.py on server 0) instead of a fixed ``shard=(i, n)``.

    reader = CriteoReader(files, 4096)                 # or TabularReader(...), LibsvmReader(...)
    loader = DynamicShards(reader, task_bytes=64 << 20, trainer=trainer)
    for epoch in trainer.epochs(3):
        for batch in trainer.prefetching(loader):
            trainer.step(loss_of(batch))

The reader's files are split into tasks (data/shards/tasks.py: byte ranges, Parquet row groups,
whole .gz files); every trainer registers the same list for each pass, then asks for a
task whenever its last one is read out, so fast trainers read more and a trainer that
joins mid-pass takes its share. After each batch the reader says where the next unread
record is; that position travels to server 0 with the push of the step that trains the
batch (client/step.py riders), so a trainer that dies or leaves hands back exactly the
records its pushed steps did not train, and a checkpoint holds the queue as of its cut:
a resumed or rolled-back job goes on where the data was.

One ``trainer.step`` per batch, in order (the reports are matched to steps that way). The
reports ride on the steps of the Trainer the loader is given (``trainer=``), or of the one whose
``trainer.prefetching(loader)`` iterates it (that binds it); a loader never looks for a Trainer
by itself (data/ does not import trainer/).

End of a pass: async, a trainer whose tasks ran out waits (once the batches it handed out
are stepped on) while other trainers' tasks are in progress (one may come back if its
trainer dies), and the pass ends when every task is done. Sync, every trainer must take
the same steps: a trainer without a task gets empty batches (``len(batch) == 0``) until
every task is done, and must step on them like on any batch (``trainer.step()`` with no
loss pushes zero gradients); the service decides for each step from the reports of steps
two before only, so the pass ends at the same step for all (after up to two empty steps).
"""
from __future__ import annotations

import collections
import time

import numpy as np

from paramshard.errors import ConfigError, DeadlineExceeded
from paramshard.data.shards.tasks import DEFAULT_TASK_BYTES, Task, fingerprint, split_files

POLL_SECONDS = 0.2         # async: how often to ask again while tasks are in progress elsewhere


class _Later:
    """Yielded instead of a batch: none is ready until the batches handed out are stepped on.
    Trainer.prefetching() takes it (trainer/prefetch.py); a loop that steps each batch before
    asking for the next never sees it."""

    def __repr__(self) -> str:
        return "LATER"


LATER = _Later()


class DynamicShards:
    def __init__(self, reader, task_bytes: int = DEFAULT_TASK_BYTES, trainer=None,
                 poll_seconds: float = POLL_SECONDS, clock=time.monotonic):
        """``reader``: a TabularReader, CriteoReader or LibsvmReader (its ``paths`` and batch
        size are used, its ``shard`` is not). ``trainer``: the Trainer whose steps train its
        batches; None: the one whose ``prefetching(loader)`` iterates it first (``bind``)."""
        if not callable(getattr(reader, "read_task", None)):
            raise ConfigError(f"DynamicShards needs a reader with read_task (TabularReader, CriteoReader, "
                              f"LibsvmReader), got {type(reader).__name__}")
        header = bool(getattr(getattr(reader, "schema", None), "format", None) and reader.schema.format.header)
        self.reader = reader
        self.files = [str(p) for p in reader.paths]
        self.tasks = split_files(reader.paths, task_bytes, header=header)
        self.fingerprint = fingerprint(self.files, self.tasks)
        self.poll_seconds = poll_seconds
        self._clock = clock
        self._trainer = trainer
        self.epoch = -1            # passes started (a reader's convention: trainer/loop.py)
        self.batches = 0
        self._next_epoch: int | None = None
        # (pass, task id, next position, done, lease) of each batch handed out and not yet stepped
        # on; None for an empty (idle) batch. The rider pops one per step.
        self._unstepped: collections.deque = collections.deque()
        self._attached = None
        self._template = None

    # -- position (trainer/loop.py): the pass only; the service knows where the data is --
    def state(self) -> dict:
        return {"epoch": self.epoch, "batches": self.batches}

    def restore(self, state: dict) -> None:
        try:
            self._next_epoch = int(state["epoch"])
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"DynamicShards state {state!r}: expected {{'epoch': int, ...}}") from None

    # -- the trainer and its step reports ---------------------------------------
    @property
    def trainer(self):
        if self._trainer is None:
            raise ConfigError("DynamicShards has no Trainer to report its batches' steps with: build it with "
                              "DynamicShards(reader, ..., trainer=trainer), or iterate it through "
                              "trainer.prefetching(loader)")
        return self._trainer

    def bind(self, trainer) -> None:
        """Report this loader's batches with ``trainer``'s steps (``trainer.prefetching(loader)``
        calls it); a loader given another Trainer is refused."""
        if self._trainer is None:
            self._trainer = trainer
        elif self._trainer is not trainer:
            raise ConfigError("this DynamicShards was given another Trainer (trainer=...) than the one iterating "
                              "it: one loader reports the steps of one Trainer")

    def _attach(self, trainer) -> None:
        if self._attached is trainer:
            return
        steps = getattr(trainer, "steps", None)
        if steps is None or trainer.links is None:
            raise ConfigError("DynamicShards needs parameter servers (sync, async or hybrid mode): server 0 "
                              "keeps the task queue; in collective mode use the static shard=(i, n)")
        steps.riders.append(self._report)
        self._attached = trainer

    def _report(self, step: int) -> list:
        """The data-shard report of ``step``: the batch it trained (client/step.py rider)."""
        trainer = self.trainer
        info = self._unstepped.popleft() if self._unstepped else None
        pass_, task, position, done, lease = info if info is not None else (self.epoch + 1, -1, 0, False, None)
        from paramshard.client.shards import progress_request
        return [progress_request(trainer.links, trainer.trainer_id, pass_, step, task, position, done, lease)]

    # -- iteration ---------------------------------------------------------------------
    def __iter__(self):
        trainer = self.trainer
        self._attach(trainer)
        self.epoch = self._next_epoch if self._next_epoch is not None else self.epoch + 1
        self._next_epoch = None
        self.batches = 0
        self._unstepped.clear()          # a new pass, or the same again after a rollback
        return self._pass(trainer, self.epoch + 1)

    def _pass(self, trainer, pass_: int):
        from paramshard.client import shards
        from paramshard.mode import Mode
        links, me = trainer.links, trainer.trainer_id
        shards.register(links, me, pass_, self.fingerprint, self.files, self.tasks, trainer.step_count)
        sync = Mode.parse(trainer.env.mode).server_mode is Mode.SYNC
        stuck = _Stuck(self._clock, stuck_after(trainer.env.timeout))
        recoveries = _recoveries(trainer)
        while True:
            if _recoveries(trainer) != recoveries:
                recoveries = self._rolled_back(trainer, pass_)
            # The step that will train the next batch: batches handed out are stepped on in order.
            step = trainer.step_count + len(self._unstepped) if sync else None
            verdict, task, lease = shards.next_task(links, me, pass_, step)
            if verdict == "finished":
                return
            if verdict == "wait":
                if sync:
                    self._unstepped.append(None)
                    self.batches += 1
                    yield self._empty()
                elif self._unstepped:
                    # Batches handed out are not stepped on yet (a prefetching loop asks for the next
                    # before the step of the current): let that step go out before waiting.
                    yield LATER
                else:
                    stuck.check(task, me)
                    time.sleep(self.poll_seconds)
                continue
            assert isinstance(task, Task)      # verdict "task": next_task raised unless the reply held one
            stuck.reset()
            for batch, position, done in _with_last(self.reader.read_task(task), task.start):
                if _recoveries(trainer) != recoveries:
                    break               # rolled back while this task was read: the restored queue says
                if batch is None:       # no record in the task (a range inside one line, bad lines only)
                    links.request_list([shards.progress_request(links, me, pass_, trainer.step_count - 1,
                                                                task.id, position, True, lease)])
                    continue
                self._template = batch if self._template is None else self._template
                self._unstepped.append((pass_, task.id, position, done, lease))
                self.batches += 1
                yield batch

    def _rolled_back(self, trainer, pass_: int) -> int:
        """The trainer rolled back (client/recovery.py) while this pass was read, in a loop that does
        not open the loader again (``for batch in loader``; trainer.prefetching does): the chief
        restored the checkpoint's queue, which hands the records after the checkpoint out again, so
        what this loader held is dropped (its batches not stepped on, the rest of its task) and the
        pass goes on with what the restored queue gives. Registering again tells the queue the
        step this trainer is at now (sync mode waits for its reports from there)."""
        from paramshard.client import shards
        self._unstepped.clear()
        shards.register(trainer.links, trainer.trainer_id, pass_, self.fingerprint, self.files, self.tasks,
                        trainer.step_count)
        return _recoveries(trainer)

    def _empty(self):
        if self._template is not None:
            return self._template.take(0, 0)
        if hasattr(self.reader, "encoder"):
            return self.reader.encoder.encode({c: np.empty(0, object) for c in self.reader.schema.used_columns})[0]
        return self.reader._parse(b"")[0]


def _recoveries(trainer) -> int:
    """Rollbacks the trainer went through so far (Trainer.recoveries)."""
    return getattr(trainer, "recoveries", 0)


def stuck_after(timeout: float) -> float:
    """How long an async trainer with no task waits while nobody reports progress: a lost
    holder's tasks come back after the grace period (PARAMSHARD_TIMEOUT), so twice that and
    a margin means the holders are alive but not stepping (hung)."""
    return 2 * timeout + 5.0


class _Stuck:
    """The deadline of waiting for other trainers' tasks: it runs while their progress mark
    stands still, and starts again whenever the mark moves."""

    def __init__(self, clock, after: float):
        self.clock, self.after = clock, after
        self.mark, self.since = None, None

    def reset(self) -> None:
        self.mark = self.since = None

    def check(self, waiting, me: int) -> None:
        now = self.clock()
        if waiting.mark != self.mark:
            self.mark, self.since = waiting.mark, now
        elif now - self.since > self.after:
            raise DeadlineExceeded(
                f"trainer {me} has had no data task for {now - self.since:.0f} s: the rest of this data pass is "
                f"held by trainers {list(waiting.held_by)}, which reported no progress since; look at their "
                f"logs (a hung trainer), or stop the job")


def _with_last(batches, start: int):
    """(batch, position, done) of the non-empty batches, ``done`` on the task's last; an empty
    batch (every line of it skipped as bad) only moves the position of the one before. A task
    without any record gives (None, its end position, True)."""
    held, last = None, start
    for batch, position in batches:
        last = position
        if len(batch) == 0:
            if held is not None:
                held = (held[0], position)
            continue
        if held is not None:
            yield held[0], held[1], False
        held = (batch, position)
    yield (held[0], held[1], True) if held is not None else (None, last, True)
