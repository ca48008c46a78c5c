"""What a move (placement/move_plan.py) says and is told, as types: the steps it asks a runner
to send, the record it leaves in the run directory, and how it failed."""
from __future__ import annotations

import dataclasses
from typing import Sequence

from paramshard.errors import ParamshardError


@dataclasses.dataclass
class MoveRecord:
    """One move, as the run directory takes it (an event's details)."""
    servers_before: list[int]
    servers_after: list[int]
    started: float
    ended: float = 0.0
    partitions: int = 0
    rows: int = 0
    bytes: int = 0
    handoffs: int = 0
    longest_handoff_s: float = 0.0
    routing_version: int = 0
    copy_s: float = 0.0                 # the background copy of the pages
    handoffs_s: float = 0.0             # every hand-off together
    finish_s: float = 0.0               # old owners dropping what they handed away
    switch_step: int | None = None      # sync mode: the step at which the routing changed
    blocks: int = 0                     # dense blocks moved
    dense_bytes: int = 0                # their values and optimizer slots
    arm_tries: int = 0
    unfinished: list = dataclasses.field(default_factory=list)   # steps a removed server did not answer

    def details(self) -> dict:
        return {**dataclasses.asdict(self), "seconds": round(self.ended - self.started, 3)}


@dataclasses.dataclass(frozen=True)
class Step:
    """One wire request of the move: ``header`` (with its ``op``) and ``arrays`` to ``server``."""
    server: int
    header: dict
    arrays: tuple = ()

    @property
    def op(self) -> str:
        return self.header["op"]

    def __str__(self) -> str:
        return f"{self.op} on server {self.server}"


@dataclasses.dataclass(frozen=True)
class Ready:
    """What to send now: ``steps`` may go together; feed back one reply per step, in order."""
    number: int
    phase: str
    steps: tuple[Step, ...]


class StepFailed(ParamshardError):
    """A step was refused (an error reply), not answered within its deadline, or lost its server."""

    def __init__(self, step: Step, cause: Exception | str):
        self.step, self.cause = step, cause
        super().__init__(f"{step}: {cause}")


class MoveFailed(ParamshardError):
    """A move that stopped at ``step``. ``undone``: aborted cleanly (the job goes on under the
    routing published last); ``in_doubt``: partitions left frozen because whether their new owner
    took them is unknown; ``moved``: it failed after every partition reached its new owner (only
    finishing failed: old owners' drops, the final routing, retire)."""

    def __init__(self, message: str, step: Step, record: MoveRecord, undone: bool,
                 in_doubt: Sequence[int] = (), unanswered: Sequence[str] = (), moved: bool = False):
        self.step, self.record, self.undone, self.moved = step, record, undone, moved
        self.in_doubt, self.unanswered = list(in_doubt), list(unanswered)
        super().__init__(message)


Replies = list  # [(header, arrays)], one per step of a Ready
