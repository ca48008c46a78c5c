"""Who is in the job, and when is step k complete: one definition for dense
blocks and sparse tables alike.

``Membership`` follows every trainer of the job through three states: live
(training), left (said ``leave``: done) and lost (its connection dropped
without a ``leave``). A lost trainer that reconnects within the grace period
(``PARAMSHARD_TIMEOUT``) is live again; after it, it is gone for good. A
``StepBarrier`` (one per dense block or sparse table) collects the trainers
that pushed the current step; the step is complete when every trainer that
has not left has pushed. A lost trainer stays required (its step cannot be
completed without it, and waiting for it fails at once), because silently
training on with fewer trainers would change the effective batch.
"""
from __future__ import annotations

import time

from ..errors import ConfigError


class Membership:
    def __init__(self, num_trainers: int, grace: float, clock=time.monotonic, min_trainers: int | None = None):
        self.num_trainers = num_trainers
        self.min_trainers = min_trainers     # async: this many leaving normally is a finished job
        self.grace = grace
        self._clock = clock
        self.started_at = clock()
        self.live: set[int] = set(range(num_trainers))
        self.left: set[int] = set()
        self.lost_since: dict[int, float] = {}    # lost, may still come back
        self.gone: set[int] = set()               # lost for longer than the grace period
        self.seen: set[int] = set()               # sent at least one request
        self.addresses: dict[int, str] = {}       # where each trainer connected from (for messages)
        self.places: dict[int, str] = {}          # what the engine calls it, e.g. "rank 3 on node7"

    def check_trainer(self, trainer: int) -> None:
        """A trainer id a request names must belong to this job."""
        if not 0 <= trainer < self.num_trainers:
            raise ConfigError(f"trainer {trainer} is not part of this job (trainers 0..{self.num_trainers - 1}); "
                              f"is PARAMSHARD_TRAINERS the same on every process?")

    def check_not_left(self, trainer: int, doing: str) -> None:
        """The one "trainer already left" rule: a trainer that said ``leave`` cannot ``doing``
        (push again, enter a barrier) any more."""
        if trainer in self.left:
            raise ConfigError(f"trainer {trainer} already left this job and cannot {doing}")

    def note_request(self, trainer: int, address: str | None = None) -> None:
        """A request from ``trainer`` (connected from ``address``): it is connected (again)."""
        self.seen.add(trainer)
        if address:
            self.addresses[trainer] = address
        if self.lost_since.pop(trainer, None) is not None:
            self.live.add(trainer)

    def leave(self, trainer: int) -> None:
        self.check_trainer(trainer)
        if trainer in self.left:
            raise ConfigError(f"trainer {trainer} already left")
        if trainer in self.gone:
            raise ConfigError(f"trainer {trainer} was declared lost after {self.grace:g} s without a "
                              f"connection; it cannot rejoin this job")
        self.live.discard(trainer)
        self.lost_since.pop(trainer, None)
        self.left.add(trainer)

    def connection_lost(self, trainer: int) -> bool:
        """Its connection dropped without a leave; True if that is news."""
        if trainer not in self.live:
            return False
        self.live.discard(trainer)
        self.lost_since[trainer] = self._clock()
        return True

    def expire(self) -> list[int]:
        """Lost trainers whose grace period ran out: now gone. Returns the new ones."""
        now = self._clock()
        expired = sorted(t for t, since in self.lost_since.items() if now - since >= self.grace)
        for t in expired:
            del self.lost_since[t]
            self.gone.add(t)
        return expired

    @property
    def required(self) -> set[int]:
        """Trainers whose push every sync step needs: all but those that left."""
        return set(range(self.num_trainers)) - self.left

    @property
    def failed(self) -> set[int]:
        """Lost or gone: a wait that needs one of them cannot succeed now."""
        return set(self.lost_since) | self.gone

    def never_arrived(self) -> list[int]:
        """Trainers not heard from since the server started, once the grace period has passed."""
        if self._clock() - self.started_at < self.grace:
            return []
        return sorted(self.live - self.seen)

    def enough_left(self) -> bool:
        """``min_trainers`` is set, no trainer is live, and at least that many left normally."""
        return bool(self.min_trainers) and not self.live and len(self.left) >= self.min_trainers

    def job_over(self) -> bool:
        """No trainer can push again: every one left or is gone, or the only ones
        still counted never arrived while every other one ended."""
        if self.enough_left():
            return True
        if self.live or self.lost_since:
            ended = self.left | self.gone
            return bool(ended) and not self.lost_since and self.live == set(self.never_arrived())
        return True

    def where(self, trainers) -> str:
        """' (trainer 1: rank 3 on node7, connected from 10.0.0.3)' for what is known of them."""
        known = []
        for t in sorted(trainers):
            facts = [f for f in (self.places.get(t), self.addresses.get(t) and
                                 f"connected from {self.addresses[t]}") if f]
            if facts:
                known.append(f"trainer {t}: {', '.join(facts)}")
        return f" ({'; '.join(known)})" if known else ""

    def summary(self) -> str:
        parts = [f"left: {sorted(self.left)}"]
        if self.gone:
            parts.append(f"lost (connection dropped, not back within {self.grace:g} s): {sorted(self.gone)}")
        missing = self.never_arrived()
        if missing:
            parts.append(f"never connected: {missing}")
        return "; ".join(parts)


class StepBarrier:
    """Arrivals for the current step of one block or table."""

    def __init__(self, membership: Membership, what: str):
        self.membership = membership
        self.what = what
        self.arrived: set[int] = set()

    def check_arrival(self, trainer: int, step: int, current: int) -> None:
        """Raise unless ``trainer`` may push ``step`` now (``current``: the step in progress)."""
        self.membership.check_trainer(trainer)
        self.membership.check_not_left(trainer, "push again")
        if step != current:
            raise ConfigError(f"trainer {trainer} pushed step {step} for {self.what}, which is at step "
                              f"{current}; every trainer must push every step once")
        if trainer in self.arrived:
            raise ConfigError(f"trainer {trainer} pushed step {step} for {self.what} twice")

    def arrive(self, trainer: int) -> None:
        self.arrived.add(trainer)

    def complete(self) -> bool:
        return bool(self.arrived) and self.membership.required <= self.arrived

    def reset(self) -> None:
        self.arrived.clear()

    def waiting_for(self) -> list[int]:
        return sorted(self.membership.required - self.arrived)
