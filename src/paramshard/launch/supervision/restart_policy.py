"""When a launcher restarts what, with one budget (``--max-restarts``): pure, no processes.

Two kinds of restart draw on the same budget:

- **in place**: only servers failed (or hang), and a checkpoint exists. The dead or
  hung servers start again on their own addresses and the trainers, still running,
  roll back to the latest checkpoint (client/recovery.py). Each root cause costs
  one restart; a server that only exited because a peer did comes back free
  (launch/supervision/peer_loss.py computes the cost).
- **whole job**: anything else failed (a trainer, or servers with no budget left for
  an in-place restart). Once the job has stopped, every server and trainer starts
  again from the latest checkpoint, for one restart.

No checkpoint yet: nothing to roll back to, so no restart of either kind (the
loop says so). A job stopped by a signal is never restarted.

An **elastic** job (``--trainers MIN:MAX``) treats a dead trainer alone
(``dead_trainer``): with budget left it is replaced in its slot by a new process that
joins the running job (one restart each, so a trainer that crashes on every start cannot
restart for ever; no checkpoint needed: nothing rolls back); without budget the job goes
on with fewer while at least MIN trainers are alive; fewer than MIN: the job fails.
"""
from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from typing import Callable


class Choice(enum.Enum):
    RESTART = "restart"
    FAIL = "fail"                      # nothing to restart (or no budget): the failure stands
    NO_CHECKPOINT = "no checkpoint"    # a restart was due, but there is nothing to roll back to
    REPLACE = "replace"                # elastic: a new process takes the dead trainer's slot
    CONTINUE = "continue"              # elastic: the job goes on without the dead trainer


@dataclasses.dataclass(frozen=True)
class Decision:
    choice: Choice
    checkpoint: Path | None = None     # RESTART: the checkpoint everyone rolls back to
    cost: int = 0                      # RESTART: restarts spent

    @property
    def restart(self) -> bool:
        return self.choice is Choice.RESTART


FAIL = Decision(Choice.FAIL)


@dataclasses.dataclass
class RestartPolicy:
    max_restarts: int = 0
    used: int = 0                      # restarts spent so far, of both kinds

    @property
    def left(self) -> int:
        return self.max_restarts - self.used

    def in_place(self, failed: int, only_servers: bool, hung: int, cost: int,
                 latest: Callable[[], Path | None]) -> Decision:
        """While the job runs: ``failed`` processes failed (``only_servers``: all of them
        servers), ``hung`` servers hang, restarting them costs ``cost``; ``latest()``: the
        latest checkpoint (asked only when a restart is due). A hung server alone with no
        checkpoint is no news: the peers' own timeout ends the job, naming it."""
        if not (failed or hung) or not only_servers or self.left < cost:
            return FAIL
        checkpoint = latest()
        if checkpoint is None:
            return Decision(Choice.NO_CHECKPOINT) if failed else FAIL
        return Decision(Choice.RESTART, checkpoint, cost)

    def whole_job(self, code: int, stopped_by_signal: bool, latest: Callable[[], Path | None]) -> Decision:
        """After a run of the job ended with ``code``: run it again from the latest checkpoint?"""
        if code == 0 or stopped_by_signal or self.left <= 0:
            return FAIL
        checkpoint = latest()
        if checkpoint is None:
            return Decision(Choice.NO_CHECKPOINT)
        return Decision(Choice.RESTART, checkpoint, 1)

    def dead_trainer(self, alive: int, minimum: int) -> Decision:
        """A trainer of an elastic job died; ``alive``: its trainers still running, ``minimum``:
        MIN of ``--trainers MIN:MAX``."""
        if self.left >= 1:
            return Decision(Choice.REPLACE, cost=1)
        if alive >= minimum:
            return Decision(Choice.CONTINUE)
        return FAIL

    def spend(self, decision: Decision) -> None:
        """The loop acts on a RESTART: its restarts are used."""
        if decision.restart or decision.choice is Choice.REPLACE:
            self.used += decision.cost
