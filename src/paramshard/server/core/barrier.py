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

An **elastic** job (``min_trainers`` set: ``launch --trainers MIN:MAX`` or async
``--min-trainers``) keeps slots 0..num_trainers-1 of which any may be empty: a
lost trainer stops being required at once (the others go on), and a process may
``join`` a slot (left, lost, gone, or a replacement of a live one) naming the
first step it pushes. A step's required set is the live trainers whose first
step is at most that step, so a join takes effect at a step boundary: the
joiner names a step no barrier of this server has completed (``join`` refuses
otherwise) and the step then in progress completes without it. Gradients are
averaged over the trainers that pushed the step, so sync elastic training
equals one process whose step k uses the concatenated batches of exactly the
trainers that pushed step k.
"""
from __future__ import annotations

import time

from paramshard.errors import ConfigError


class Membership:
    def __init__(self, num_trainers: int, grace: float, clock=time.monotonic, min_trainers: int | None = None):
        self.num_trainers = num_trainers
        self.min_trainers = min_trainers     # set: an elastic job; this many leaving normally is a finished job
        self.elastic = min_trainers is not None
        self.first_step: dict[int, int] = {}      # elastic: a joined trainer's first step (absent: 0)
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

    def check_can_join(self, trainer: int) -> None:
        self.check_trainer(trainer)
        if not self.elastic:
            raise ConfigError(f"trainer {trainer} asked to join, but this job is not elastic: every trainer "
                              f"starts with it (launch --trainers MIN:MAX makes an elastic job)")

    def join(self, trainer: int, first_step: int) -> None:
        """A process takes slot ``trainer`` of an elastic job from ``first_step`` on (the caller
        checked no step barrier completed that step): whatever the slot was (left, lost, gone,
        or live with a process being replaced) it is live again and required from then on."""
        self.check_can_join(trainer)
        if first_step < 0:
            raise ConfigError(f"trainer {trainer} asked to join from step {first_step}: steps start at 0")
        self.left.discard(trainer)
        self.gone.discard(trainer)
        self.lost_since.pop(trainer, None)
        self.live.add(trainer)
        self.seen.add(trainer)
        self.first_step[trainer] = first_step

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
        """Trainers whose push every sync step needs: all but those that left (elastic: the
        live ones that arrived; a lost trainer is no longer waited for)."""
        if self.elastic:
            # A slot whose process died before its first request never drops a connection: once
            # the grace period passed it is not waited for either (a replacement joins it).
            return self.live - set(self.never_arrived())
        return set(range(self.num_trainers)) - self.left

    def required_for(self, step: int | None) -> set[int]:
        """``required`` for step ``step``: without the joiners whose first step comes later."""
        required = self.required
        if step is None or not self.first_step:
            return required
        return {t for t in required if self.first_step.get(t, 0) <= step}

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
        minimum = self.min_trainers
        if not minimum:
            return False
        return not self.live and len(self.left) >= minimum

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
        self.step: int | None = None      # the step the arrivals belong to (set by the first arrival)

    def check_arrival(self, trainer: int, step: int, current: int) -> None:
        """Raise unless ``trainer`` may push ``step`` now (``current``: the step in progress)."""
        self.membership.check_trainer(trainer)
        self.membership.check_not_left(trainer, "push again")
        if step != current:
            raise ConfigError(f"trainer {trainer} pushed step {step} for {self.what}, which is at step "
                              f"{current}; every trainer must push every step once")
        if trainer in self.arrived:
            raise ConfigError(f"trainer {trainer} pushed step {step} for {self.what} twice")
        first = self.membership.first_step.get(trainer, 0)
        if step < first:
            raise ConfigError(f"trainer {trainer} joined from step {first} but pushed step {step} for "
                              f"{self.what}: a joiner pushes from the step it joined at")
        self.step = step

    def arrive(self, trainer: int) -> None:
        self.arrived.add(trainer)

    def complete(self) -> bool:
        return bool(self.arrived) and self.membership.required_for(self.step) <= self.arrived

    def reset(self) -> None:
        self.arrived.clear()
        self.step = None

    def waiting_for(self) -> list[int]:
        return sorted(self.membership.required_for(self.step) - self.arrived)
