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
from typing import Iterable, Sequence

from paramshard.server.core.barrier import Membership


class Clocks:
    """Each trainer's clock on this server, and each dense block's. The gate asks the blocks'
    own clocks: a trainer's step can reach one server in more than one push (a push refused
    as ``moved`` is split again and resent, and a server may get parts of one step from two
    refusals, or one part before a move and one after), so a trainer clock that ticks on its
    first part would open a gate before the other parts' gradients are in. The trainer clocks
    give the staleness histogram and where a joiner starts."""

    def __init__(self, membership: Membership, bound: int | None = None):
        self.membership = membership
        self.bound = bound
        self.clock: dict[int, int] = {}
        self.block_clock: dict[str, dict[int, int]] = {}    # block -> trainer -> its steps in the block
        self.histogram: Counter = Counter()

    def pushed(self, trainer: int, step: int, names: Iterable[str] = ()) -> int:
        """Trainer's step ``step`` (0-based) is applied to blocks ``names``: its staleness."""
        for name in names:
            per = self.block_clock.setdefault(name, {})
            per[trainer] = max(per.get(trainer, 0), step + 1)
        self.clock[trainer] = max(self.clock.get(trainer, 0), step + 1)
        staleness = max(self.clock.values()) - self.clock[trainer]
        self.histogram[staleness] += 1
        return staleness

    def export(self, names: list[str]) -> list[list[list[int]]]:
        """For each block of ``names``, [[trainer, clock], ...]: what its new owner takes in
        (``merge``)."""
        return [[[t, c] for t, c in sorted(self.block_clock.get(n, {}).items())] for n in names]

    def merge(self, names: list[str], per_block: list) -> None:
        """Take in the clocks of blocks imported from their old owner: their values carry every
        step counted there, so a gate here must not wait for them again, nor for a trainer
        whose latest push went there (docs/DESIGN.md 5f)."""
        for name, pairs in zip(names, per_block):
            per = self.block_clock.setdefault(name, {})
            for trainer, clock in pairs:
                per[trainer] = max(per.get(trainer, 0), clock)
                self.clock[trainer] = max(self.clock.get(trainer, 0), clock)

    def forget(self, names: Iterable[str]) -> None:
        """Blocks handed to another server: their clocks went with them."""
        for name in names:
            self.block_clock.pop(name, None)

    def _reached(self, trainer: int, need: int, names: Sequence[str]) -> bool:
        """Has ``trainer`` ``need`` steps in every block of ``names`` (none named: anywhere here)?"""
        first = self.membership.first_step.get(trainer, 0)   # a joiner starts level with the step it joined at
        if first >= need:
            return True
        if self.clock.get(trainer, 0) < need:      # a block's clock never runs ahead of its trainer's
            return False
        return all(self.block_clock.get(n, {}).get(trainer, 0) >= need for n in names)

    def fastest(self) -> int:
        """Steps the fastest trainer has had applied (where a joiner of an async job starts)."""
        return max(self.clock.values(), default=0)

    def may_start(self, step: int, names: Sequence[str] = ()) -> bool:
        """May a trainer start ``step`` with these blocks' values (none named: by the trainer
        clocks)?"""
        return not self.laggards(step, names)

    def laggards(self, step: int, names: Sequence[str] = ()) -> list[int]:
        """Trainers a start of ``step`` waits for."""
        if self.bound is None:
            return []
        need = step - self.bound
        return sorted(t for t in self.membership.required if not self._reached(t, need, names))

    def stats(self) -> dict[int, int]:
        """Pushes by staleness, in increasing staleness."""
        return dict(sorted(self.histogram.items()))

    def reset(self) -> None:
        self.clock.clear()
        self.block_clock.clear()
        self.histogram.clear()
