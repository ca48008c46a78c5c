"""Async staleness on one server: how far each push is behind the fastest trainer,
and the bounded-staleness gate (SSP: Ho et al. 2013, Petuum; ps-lite's bounded delay).

Each trainer's clock is the number of its steps this server has applied. The
staleness of a push is how many steps the fastest trainer is ahead of the
pushing one once the push is in (0: it is the fastest, or level with it).

With a bound K (``--max-staleness K``), a trainer may start step j only when
every trainer still in the job (lost ones included: waiting for one fails at
once) has finished step j - K - 1, i.e. the slowest clock is at least j - K.
The trainer learns it may go on from the reply to a push; the push says which
step the trainer starts on that reply (``resume_step``). Then no push records
a staleness above K: when the fastest trainer started its latest step s, the
slowest had a clock of at least s - K. K = 0 is lockstep: with one trainer,
exactly what sync mode computes.
"""
from __future__ import annotations

from collections import Counter

from paramshard.server.core.barrier import Membership


class Clocks:
    def __init__(self, membership: Membership, bound: int | None = None):
        self.membership = membership
        self.bound = bound
        self.clock: dict[int, int] = {}
        self.histogram: Counter = Counter()

    def pushed(self, trainer: int, step: int) -> int:
        """Trainer's step ``step`` (0-based) is applied: its staleness."""
        self.clock[trainer] = max(self.clock.get(trainer, 0), step + 1)
        staleness = max(self.clock.values()) - self.clock[trainer]
        self.histogram[staleness] += 1
        return staleness

    def export(self) -> list[list[int]]:
        """[[trainer, clock], ...]: what a new owner of dense blocks takes in (``merge``)."""
        return [[t, c] for t, c in sorted(self.clock.items())]

    def merge(self, pairs: list) -> None:
        """Take in another server's clocks (the old owner of blocks imported here): a block's
        values carry every step counted there, so a gate here must not wait for them again,
        nor for a trainer whose latest push went there (docs/DESIGN.md 5f)."""
        for trainer, clock in pairs:
            self.clock[trainer] = max(self.clock.get(trainer, 0), clock)

    def slowest(self) -> int:
        required = self.membership.required
        return min((self._clock_of(t) for t in required), default=0)

    def _clock_of(self, trainer: int) -> int:
        # A joiner (elastic job) starts level with the step it joined at, not at 0.
        return max(self.clock.get(trainer, 0), self.membership.first_step.get(trainer, 0))

    def fastest(self) -> int:
        """Steps the fastest trainer has had applied (where a joiner of an async job starts)."""
        return max(self.clock.values(), default=0)

    def may_start(self, step: int) -> bool:
        return self.bound is None or self.slowest() >= step - self.bound

    def laggards(self, step: int) -> list[int]:
        """Trainers a start of ``step`` waits for."""
        if self.bound is None:
            return []
        return sorted(t for t in self.membership.required if self._clock_of(t) < step - self.bound)

    def stats(self) -> dict[int, int]:
        """Pushes by staleness, in increasing staleness."""
        return dict(sorted(self.histogram.items()))

    def reset(self) -> None:
        self.clock.clear()
        self.histogram.clear()
