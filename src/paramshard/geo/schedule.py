"""When a GEO trainer sends: after k local steps. The seam between the GEO backend, which
measures each round, and the policy that picks the next k (a fixed ``--geo-k K``, or
``--geo-k auto``: geo/auto_k.py).

A *round* is the k local steps between two sends, then the send itself (push the deltas of
what the trainer touched, pull the merged values). The backend hands every finished round to
``next_k`` and trains the k it returns; the policy never returns more than ``bound`` (the
job's ``--max-staleness``: a trainer's replica is then never more than that many of its own
steps behind the servers' merged values).
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol, runtime_checkable


@dataclasses.dataclass(frozen=True)
class Round:
    """What one round measured, on one trainer."""
    steps: int                 # local steps trained since the last send (the k of this round)
    compute_seconds: float     # those steps' forward, backward and local optimizer
    wire_seconds: float        # the send: push the deltas, pull the merged values (waiting included)
    bytes_sent: int            # on the wire both ways, payload bytes
    delta_norm: float          # L2 norm of the change this trainer sent (before the division by n)
    value_norm: float          # L2 norm of the values it touched, after the merge
    drift_norm: float          # L2 norm of (merged - what this trainer had): the others' change it missed
    # The same two over the *settled* values only: the dense ones and the rows this trainer's own
    # change in the round moved by less than their size (young rows excluded: geo/replica.py
    # TableReplica.merged says why). None: not measured (auto-k then reads the two above).
    settled_value_norm: float | None = None
    settled_drift_norm: float | None = None
    # Overlapped sends (--geo-send overlapped): wire_seconds runs from the send to the step
    # boundary at which the merge landed, and the trainer trained meanwhile; blocked_seconds is
    # what the round took from training (sending, and waiting where the merge was due). None:
    # the send blocked for all of wire_seconds.
    blocked_seconds: float | None = None
    # How far, in its own steps, the replica had fallen behind the merged values when this merge
    # landed (never over the bound). None: the round's steps (a blocking send).
    staleness: int | None = None
    pieces: int = 1            # pushes the round went out in (overlapped: one per step boundary)


@runtime_checkable
class GeoSchedule(Protocol):
    """Picks k, the local steps of the next round."""
    bound: int                 # the largest k it may return (--max-staleness, or the default cap)

    def first_k(self) -> int:
        """k of the first round (nothing measured yet)."""

    def next_k(self, done: Round) -> int:
        """k of the round after ``done``; 1 <= k <= bound."""


class FixedK:
    """``--geo-k K``: every round trains K steps."""

    def __init__(self, k: int, bound: int | None = None):
        if k < 1:
            raise ValueError(f"--geo-k {k}: k counts local steps between sends, at least 1")
        self.bound = k if bound is None else bound
        if k > self.bound:
            raise ValueError(f"--geo-k {k} is over --max-staleness {self.bound}: a replica would fall further "
                             f"behind than the bound allows; lower one or raise the other")
        self.k = k

    def first_k(self) -> int:
        return self.k

    def next_k(self, done: Round) -> int:
        return self.k


if TYPE_CHECKING:   # `make typecheck` checks the contract: GeoSchedule (above)
    _schedule: type[GeoSchedule] = FixedK
