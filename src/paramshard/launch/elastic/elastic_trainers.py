"""The trainers of an elastic job (``paramshard launch --trainers MIN:MAX``), for the Launcher loop.

The launcher starts MAX trainers, one per slot 0..MAX-1 (``JobControl.trainers`` is indexed by
slot): a sync job's first steps then need every slot it has, and the servers know from the
start which trainers step 0 waits for; MIN is the floor the job may shrink to. Then:

- a trainer that dies is decided alone (``RestartPolicy.dead_trainer``): replaced in its slot
  by a new process that joins the running job (PARAMSHARD_JOINING; one restart of
  ``--max-restarts`` each), or, with no budget, the job goes on with fewer while at least MIN
  are alive; fewer: the job fails, naming the dead trainers;
- ``scale(n)`` (``paramshard scale RUN_DIR --trainers N``, through launch/elastic/control_channel.py)
  starts new trainers in free slots (lowest first), or asks the highest running slots to
  leave at their next step boundary (``JobControl.ask_to_leave``: SIGUSR1 for a local
  process, trainer/leave_request.py); a trainer asked to leave that exits (0, or killed by that
  signal before its Trainer took it) left, and is not counted as failed.

The job is seen through its ``JobControl`` (launch/elastic/job_control.py), which the Launcher
implements. Each change is told through ``JobControl.tell_membership`` as (change, text, fields) with the
slot (``trainer``) and ``live``, the trainers running after it; changes: joined, left, lost,
replaced, "asked to leave", and "scale" for a request (``trainers``: the count asked for).
observe/live/job_watch.py writes them as the run directory's events, which the report's elastic
section reads (observe/run_records/elastic_view.py).
"""
from __future__ import annotations

import dataclasses

from paramshard.errors import ConfigError
from paramshard.log import get_logger
from paramshard.launch.elastic.job_control import JobControl
from paramshard.launch.engines.process import Process
from paramshard.launch.supervision.restart_policy import Choice

log = get_logger("launch")


class ElasticTrainers:
    def __init__(self, job: JobControl, minimum: int):
        self.job = job
        self.minimum = minimum
        self.maximum = len(job.spec.trainers)
        self.leaving: set[Process] = set()       # asked to leave, not ended yet
        self.done: set[Process] = set()          # ended and dealt with: left, lost (going on without), replaced
        self.failed: list[Process] = []          # dead with nothing to be done: the job fails

    # -- the loop's questions -------------------------------------------------
    def running(self) -> list[int]:
        return [slot for slot, p in enumerate(self.job.trainers) if p.poll() is None]

    def tolerated(self, failed: list[Process]) -> list[Process]:
        """Of the processes that failed, the trainers the job goes on without (left on request,
        replaced, or lost with at least MIN alive); each decided once."""
        for p in [p for p in self.job.trainers if p.poll() is not None and p not in self.done]:
            self._ended(p)
        return [p for p in failed if p in self.done]

    def _ended(self, p: Process) -> None:
        slot = self.job.trainers.index(p)
        code = p.poll()
        if p in self.leaving:
            self.leaving.discard(p)
            self.done.add(p)
            self._tell("left", f"trainer {slot} left on request (exit {code})", slot)
            return
        if code == 0:
            return          # ended normally: the job's end, as in any job
        # Alive: running, or ended normally (done with its data), but not left on request or lost.
        alive = sum(1 for q in self.job.trainers if q.poll() in (None, 0) and q not in self.done)
        decision = self.job.policy.dead_trainer(alive, self.minimum)
        if decision.choice is Choice.REPLACE:
            self.job.policy.spend(decision)
            self.done.add(p)
            self._start(slot)
            self._tell("replaced", f"{p.describe_exit()}; a new process takes slot {slot} and joins the running "
                                   f"job (restart {self.job.policy.used} of {self.job.policy.max_restarts})",
                       slot)
        elif decision.choice is Choice.CONTINUE:
            self.done.add(p)
            self._tell("lost", f"{p.describe_exit()}; training continues with {alive} trainers "
                               f"(at least {self.minimum}: --trainers {self.minimum}:{self.maximum})", slot)
        else:
            log.error("%s; %d trainers alive, fewer than %d (--trainers %d:%d) and no restart left: the job fails",
                      p.describe_exit(), alive, self.minimum, self.minimum, self.maximum)

    # -- scale ---------------------------------------------------------------
    def scale(self, n: int) -> str:
        """Run ``n`` trainers: start some in free slots, or ask the highest to leave. Returns what
        it did; ConfigError for a count outside MIN:MAX or slots not free yet."""
        if not self.minimum <= n <= self.maximum:
            raise ConfigError(f"--trainers {n}: this job runs {self.minimum} to {self.maximum} trainers "
                              f"(launched with --trainers {self.minimum}:{self.maximum})")
        staying = self.staying()
        self._tell("scale", f"asked for {n} trainers ({len(staying)} running)", None, trainers=n)
        if n > len(staying):
            free = [s for s, p in enumerate(self.job.trainers) if p.poll() is not None]
            if len(free) < n - len(staying):
                raise ConfigError(f"--trainers {n}: only {len(free)} slots are free while {len(self.leaving)} "
                                  f"trainers are still leaving; ask again once they left")
            for slot in free[:n - len(staying)]:
                self._start(slot)
                self._tell("joined", f"trainer {slot} starts and joins the running job", slot)
            return f"starting trainers {free[:n - len(staying)]}: {n} trainers"
        if n < len(staying):
            going = sorted(staying)[n:]
            self.ask_to_leave(going)
            return f"asked trainers {going} to leave at their next step boundary: {n} trainers"
        return f"already {n} trainers"

    def staying(self) -> list[int]:
        """The slots running and not asked to leave."""
        return [s for s in self.running() if self.job.trainers[s] not in self.leaving]

    def ask_to_leave(self, slots: list[int]) -> None:
        """Ask the trainers of ``slots`` to leave at their next step boundary (``scale --trainers N``,
        ``--remove-host HOST``); every engine can (launch/engines/process.py)."""
        for slot in slots:
            self.leaving.add(self.job.trainers[slot])
            self.job.ask_to_leave(slot)
            self._tell("asked to leave", f"trainer {slot} asked to leave at its next step boundary", slot)

    # -- helpers ---------------------------------------------------------------
    def _start(self, slot: int) -> None:
        rank = self.job.spec.trainers[slot]
        # Placed by the job (SSH: on the least loaded host).
        self.job.start_trainer(slot, dataclasses.replace(rank, env=dataclasses.replace(rank.env, joining=True)))

    def _tell(self, change: str, text: str, slot: int | None, **fields) -> None:
        log.warning("%s", text) if change in ("lost", "replaced") else log.info("%s", text)
        live = len(self.running())
        self.job.tell_membership(change, text, trainer=slot, live=live, **fields)
