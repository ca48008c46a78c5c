"""The data-shard queue of one job: which tasks (messages/shard_tasks.py; data/shards/tasks.py
makes them from files) of the current data pass are waiting, in progress (and where each
stands), and done. Pure: no sockets, no clock; the shard service
(server/elastic/shard_service.py) puts it on server 0.

- ``register(pass_, fingerprint, files, tasks)``: the pass's task list. Every trainer
  registers (they all compute the same list); a repeat of the same list is accepted, a
  different one refused. A pass starts only once the one before is finished.
- ``next(trainer, pass_, step)``: a task (its remainder: from the committed position),
  ``finished`` (every task of the pass done) or ``wait`` (tasks in progress elsewhere may
  come back). A trainer may hold a few tasks at once (MAX_HELD): it asks for the next as
  soon as it has read one out, before the step that trains its last batch reports it done.
- ``progress(trainer, step, task, position, done, lease)``: sent with every step's push
  (client/step.py); the position is the next unread record, so a remainder handed to
  another trainer starts exactly there. A step without a task reports too (sync mode
  counts the reports, see ``sync_verdict``).
- ``lease``: which queue a task was handed out by. A ``restore`` or ``reset`` (a rollback)
  starts a new lease; a report of a task handed out under an older one (a trainer's step in
  flight, or a loader still reading what it held, when the chief restored the checkpoint's
  queue) is stale: it counts as a step without a task and ``progress`` returns False, never an
  error, so the restored remainder is handed out once, from the checkpoint's position.
- ``release(trainer)``: a trainer left or was lost: the remainders of its tasks go back to
  the front of the queue. So does a registration from another process (``session``) in the
  same trainer slot: a replacement, whose predecessor is gone.

Sync mode: every trainer must take the same steps, yet they run out of tasks at different
times. A trainer without a task pushes empty steps; whether the pass is over at step j is
decided from the reports of steps <= j - 2 only (every trainer's, which the service waits
for), so every trainer gets the same answer for the same step and the pass ends for all at
once. Two steps back, not one: a trainer prefetching its next batch asks for step j + 1's
data while step j (whose report it has not sent yet) trains.

Snapshots (``snapshot(after)``) leave out the reports of steps past a checkpoint's cut
(``after``: trainer -> last step included), using a bounded undo log; restoring one puts
every task that was in progress back in the queue at its saved position.
"""
from __future__ import annotations

import collections
import dataclasses

from paramshard.messages.shard_tasks import KINDS, MAX_TASKS
from paramshard.errors import ConfigError, LimitExceeded

MAX_FILES = 100_000
MAX_NAME_CHARS = 4096
UNDO_PER_TRAINER = 64        # reports kept to roll a snapshot back to a cut (a cut is a step or two back)
MAX_SESSION_CHARS = 64
MAX_HELD = 4                 # tasks one trainer holds at once (read out, not yet reported done)
FINISHED, WAIT, TASK = "finished", "wait", "task"


@dataclasses.dataclass
class _Undo:
    trainer: int
    step: int
    task: int
    position: int     # before the report
    done_step: int | None


class ShardQueue:
    def __init__(self, num_trainers: int, lease: int = 0):
        self._start(num_trainers, lease)

    def _start(self, num_trainers: int, lease: int) -> None:
        """Empty: no pass registered (a new queue, a restore, a reset)."""
        self.num_trainers = num_trainers
        self.lease = lease                           # bumped by restore() and reset(): see progress()
        self.pass_ = 0                   # 0: nothing registered yet
        self.fingerprint = ""
        self.files: list[str] = []
        self.tasks: list[list[int]] = []             # wire form [file, start, end, kind]
        self.position: list[int] = []                # task -> next unread record
        self.done_step: dict[int, int] = {}          # task -> the step whose report finished it
        self.pending: collections.deque[int] = collections.deque()
        self.owner: dict[int, int] = {}              # task -> trainer holding it
        self.holding: dict[int, list[int]] = {}      # trainer -> its tasks, oldest first
        self.reported: dict[int, int] = {}           # trainer -> last step it reported
        self.left: set[int] = set()                  # released and not registered again: not waited for
        self.sessions: dict[int, str] = {}           # trainer -> the process that registered last
        self._previous: dict | None = None           # the pass before, as it ended (snapshot())
        self._previous_undo: list[_Undo] = []
        self.undo: collections.deque[_Undo] = collections.deque(maxlen=UNDO_PER_TRAINER * max(num_trainers, 1))

    # -- the pass ----------------------------------------------------------------
    def register(self, pass_: int, fingerprint: str, files: list, tasks: list, trainer: int | None = None,
                 step: int | None = None, session: str | None = None) -> str:
        """``trainer`` at ``step`` registers: its reports of earlier steps are not waited for.
        ``session`` names the trainer's process: another process in the same slot (a
        replacement) means the old one is gone, and so are its tasks."""
        got = self._register(pass_, fingerprint, files, tasks)
        if trainer is None:
            return got
        if session is not None:
            if len(session) > MAX_SESSION_CHARS:
                raise ConfigError(f"a session name has at most {MAX_SESSION_CHARS} characters")
            if self.sessions.get(trainer, session) != session:
                self.release(trainer)
                self.reported.pop(trainer, None)     # the new process counts its own steps
            self.sessions[trainer] = session
        if step is not None:
            self.reported[trainer] = max(self.reported.get(trainer, -1), step - 1)
        self.left.discard(trainer)          # waited for again, from its step on
        return got

    def _register(self, pass_: int, fingerprint: str, files: list, tasks: list) -> str:
        if pass_ < self.pass_:
            return "past"               # a trainer catching up: its next() says finished
        if pass_ == self.pass_:
            if fingerprint != self.fingerprint:
                raise ConfigError(f"data pass {pass_}: a different task list was registered already (files or "
                                  f"task_bytes differ between trainers?): every trainer must pass the same files "
                                  f"and task_bytes to DynamicShards")
            return "same"
        if self.pass_ and not self.finished:
            raise ConfigError(f"data pass {pass_} registered while pass {self.pass_} still has "
                              f"{len(self.tasks) - len(self.done_step)} tasks not done")
        _check_list(files, tasks)
        # The pass that just ended, for a snapshot whose cut falls before its last reports
        # (async: a push held at the cut, its report not): see snapshot().
        self._previous = self._state(list(self.position), dict(self.done_step)) if self.pass_ else None
        self._previous_undo = list(self.undo)
        self.pass_, self.fingerprint, self.files, self.tasks = pass_, fingerprint, list(files), [list(t) for t in tasks]
        self.position = [t[1] for t in self.tasks]
        self.done_step, self.owner, self.holding = {}, {}, {}
        self.pending = collections.deque(range(len(self.tasks)))
        self.undo.clear()
        return "registered"

    @property
    def finished(self) -> bool:
        return len(self.done_step) == len(self.tasks)

    def next(self, trainer: int, pass_: int, step: int | None = None) -> tuple[str, list | None]:
        """(TASK, [id, file, position, end, kind]) / (FINISHED, None) / (WAIT, None).
        ``step`` (sync mode): the step that will train the data asked for; FINISHED then only
        when every task was done by a report of step ``step - 2`` or earlier."""
        if pass_ < self.pass_:
            return FINISHED, None
        if pass_ > self.pass_:
            return WAIT, None           # not registered yet
        if self.pending:
            held = self.holding.setdefault(trainer, [])
            if len(held) >= MAX_HELD:
                raise LimitExceeded(f"trainer {trainer} holds {len(held)} data tasks not reported done (at most "
                                    f"{MAX_HELD}): one trainer.step per batch reports them")
            task = self.pending.popleft()
            self.owner[task] = trainer
            held.append(task)
            return TASK, self._wire(task)
        if self.finished and (step is None or max(self.done_step.values(), default=-1) <= step - 2):
            return FINISHED, None
        return WAIT, None

    def waiting_on(self) -> tuple[list[int], int]:
        """Who holds the tasks not done (sorted trainers) and a mark that moves whenever any of
        them reports progress: a trainer told to wait gives up when the mark stands still too long."""
        return sorted({self.owner[t] for t in self.owner}), sum(self.position) + len(self.done_step)

    def _wire(self, task: int) -> list:
        file, _, end, kind = self.tasks[task]
        return [task, file, self.position[task], end, kind]

    # -- reports -----------------------------------------------------------------
    def progress(self, trainer: int, pass_: int, step: int, task: int, position: int, done: bool,
                 lease: int | None = None) -> bool:
        """A step's report; ``task`` -1: the trainer held no task in that step. False: the task was
        handed out under an older ``lease`` (before a rollback restored the queue): the report
        counts as one without a task and changes no task (the trainer drops it)."""
        if task >= 0 and lease is not None and lease != self.lease:
            # Not an error: the rollback's restore put the task back at the checkpoint's position
            # (or someone else holds it now); this trainer's position is from the undone timeline.
            self.reported[trainer] = max(step, self.reported.get(trainer, -1))
            return False
        # The same step again is a task read out without a record (reported at once, data/shards/dynamic.py).
        if step < self.reported.get(trainer, -1):
            raise ConfigError(f"trainer {trainer}: a shard report for step {step}, but it reported step "
                              f"{self.reported[trainer]} already")
        if task >= 0:
            if pass_ != self.pass_:
                raise ConfigError(f"trainer {trainer}: a report for data pass {pass_}, the queue is in pass "
                                  f"{self.pass_}")
            if not 0 <= task < len(self.tasks) or self.owner.get(task) != trainer:
                raise ConfigError(f"trainer {trainer} reported task {task}, which it does not hold")
            if type(position) is not int or not self.position[task] <= position < 1 << 62:
                raise ConfigError(f"trainer {trainer}: task {task} position {position} is before the committed "
                                  f"{self.position[task]}")
            self.undo.append(_Undo(trainer, step, task, self.position[task], None))
            self.position[task] = position
            if done:
                self.done_step[task] = step
                del self.owner[task]
                self.holding[trainer].remove(task)
        self.reported[trainer] = max(step, self.reported.get(trainer, -1))
        self.left.discard(trainer)          # it reports: waited for again
        return True

    def release(self, trainer: int) -> list[int]:
        """``trainer`` is gone: the remainders of its tasks go to the front of the queue, and its
        reports are not waited for any more (``reports_missing``) until a process in its slot
        registers or reports again (a joiner: sync steps waited for the leaver's reports while the joiner's
        first pull waited for theirs)."""
        self.left.add(trainer)
        tasks = self.holding.pop(trainer, [])
        for task in reversed(tasks):
            del self.owner[task]
            self.pending.appendleft(task)
        return tasks

    def reports_missing(self, step: int, required) -> list[int]:
        """Trainers (of ``required``, among those that ever reported) whose report of ``step``
        has not arrived."""
        return sorted(t for t in required if t in self.reported and t not in self.left and self.reported[t] < step)

    # -- snapshots ---------------------------------------------------------------
    def snapshot(self, after: dict[int, int] | None = None) -> dict:
        """JSON state; reports of steps past ``after[trainer]`` left out (undone).

        A cut before the last reports of the pass before the current one (async: the step
        that finished it was held at the cut) gives that pass, rolled back: every report of
        the current pass came later still (its tasks were handed out only once the pass
        before was finished), so none of them is in the checkpoint."""
        past = lambda u: after is not None and u.step > after.get(u.trainer, u.step)    # noqa: E731
        if self._previous is not None and any(past(u) for u in self._previous_undo):
            state = dict(self._previous)
            position, done = list(state["position"]), set(state["done"])
            for u in reversed(self._previous_undo):
                if past(u):
                    position[u.task] = u.position
                    done.discard(u.task)
            return {**state, "position": position, "done": sorted(done)}
        position, done_step = list(self.position), dict(self.done_step)
        for u in reversed(self.undo):
            if past(u):
                position[u.task] = u.position
                done_step.pop(u.task, None)
        return self._state(position, done_step)

    def _state(self, position: list, done_step: dict) -> dict:
        return {"pass": self.pass_, "fingerprint": self.fingerprint, "files": list(self.files),
                "tasks": [list(t) for t in self.tasks], "position": position, "done": sorted(done_step)}

    def restore(self, state: dict) -> None:
        """Back to a snapshot: tasks not done wait in the queue at their saved positions."""
        try:
            pass_, fingerprint, files, tasks = state["pass"], state["fingerprint"], state["files"], state["tasks"]
            position, done = state["position"], state["done"]
        except (KeyError, TypeError):
            raise ConfigError("shard state: expected pass, fingerprint, files, tasks, position, done") from None
        if type(pass_) is not int or pass_ < 0 or not isinstance(fingerprint, str) or len(fingerprint) > 64:
            raise ConfigError("shard state: pass must be an int >= 0 and fingerprint a short string")
        _check_list(files, tasks)
        if not isinstance(position, list) or len(position) != len(tasks) or \
                not all(type(p) is int and p >= 0 for p in position):
            raise ConfigError("shard state: one non-negative position per task expected")
        if not isinstance(done, list) or not all(type(d) is int and 0 <= d < len(tasks) for d in done) \
                or len(set(done)) != len(done):
            raise ConfigError("shard state: done must list distinct task ids")
        self._start(self.num_trainers, self.lease + 1)
        self.pass_, self.fingerprint, self.files = pass_, fingerprint, list(files)
        self.tasks, self.position = [list(t) for t in tasks], list(position)
        self.done_step = {d: -1 for d in done}
        self.pending = collections.deque(t for t in range(len(tasks)) if t not in self.done_step)

    def reset(self) -> None:
        self._start(self.num_trainers, self.lease + 1)


def _check_list(files, tasks) -> None:
    """Sizes and types before anything is kept: a client cannot make the queue grow without bound."""
    if not isinstance(files, list) or len(files) > MAX_FILES or \
            not all(isinstance(f, str) and 0 < len(f) <= MAX_NAME_CHARS for f in files):
        raise LimitExceeded(f"a task list names at most {MAX_FILES} files, each a name of 1 to "
                            f"{MAX_NAME_CHARS} characters")
    if not isinstance(tasks, list) or len(tasks) > MAX_TASKS:
        raise LimitExceeded(f"a task list holds at most {MAX_TASKS} tasks: pass a larger task_bytes")
    for t in tasks:
        if not (isinstance(t, list) and len(t) == 4 and all(type(x) is int for x in t)
                and 0 <= t[0] < len(files) and t[1] >= 0 and t[2] >= -1 and 0 <= t[3] < len(KINDS)):
            raise ConfigError(f"a task must be [file index, start, end, kind], got {str(t)[:80]}")
