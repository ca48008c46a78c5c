"""Which virtual partitions (placement/partitions.py) this server serves, through a move.

Each partition is, on this server: owned (served), incoming (being handed to it: requests
for it are held until its rows are all here), or neither (refused with ``moved``: the
client fetches the routing and resends). An owned partition being copied out is tracked:
the ids that requests touched since the copy began are dirty, and travel again at the
hand-off. A frozen (handed away) partition's rows stay until ``finish`` drops them.

All or nothing: a request touching any partition that is not served is refused (or held)
whole, before anything is applied, so a push is applied exactly once: here before the
hand-off (and then carried by the copy or the dirty rows), or by the new owner after it.
Pure state: no socket, no store; the MigrationHook feeds it ids and the clock.
"""
from __future__ import annotations

import collections
import time
from typing import Callable

import numpy as np

from paramshard.errors import ConfigError, Moved
from paramshard.placement.partitions import Routing, partition_of
from paramshard.server.core.hooks import Verdict
from paramshard.server.elastic.move_holds import MoveHolds


class PartitionOwnership:
    def __init__(self, me: int, routing: Routing, clock: Callable[[], float] = time.monotonic):
        self.me, self.routing, self.clock = me, routing, clock
        # Requests held for incoming partitions, in the server's one queue of a move (dense blocks too).
        self.holds = MoveHolds(clock)
        self.holds.on_expire.append(self._stop_expecting)
        p = routing.partitions
        self.owned = routing.owners == me
        self.incoming = np.zeros(p, bool)
        self.copying = np.zeros(p, bool)
        self.lost = np.zeros(p, bool)              # handed away: rows to drop once the move ends
        self.dirty: dict[str, list[np.ndarray]] = collections.defaultdict(list)
        # Sync mode: (step S, routing version V): requests of step S on must carry routing V or
        # later (older ones are refused, so every trainer changes routing at the same step), and
        # a server taking partitions holds them all until the rows are here.
        self.switch: tuple[int, int] | None = None
        # Whether that hold applies: from the arm until the next move expects partitions or blocks
        # here (a move expects before it arms; an aborted one stops expecting). The refusal of
        # older routings stays (a push of step >= S built under an older routing would miss a
        # server), but a later move's new owner holding the steps before its own switch for the
        # switch of the move before would hold what its hand-off waits for: a deadlock (issue 29,
        # a sync job scaled 2 -> 3 -> 2).
        self.holding = False
        # The first routing version whose requests may come here: past the one a server joined
        # under mid-job (it owned nothing in it); the async checkpoint's cut reads it.
        self.joined_at = 0

    @property
    def elastic(self) -> bool:
        return self.routing.elastic

    def partitions(self, ids: np.ndarray) -> np.ndarray:
        return partition_of(ids, self.routing.partitions)

    # -- requests ---------------------------------------------------------
    def verdict(self, ids: np.ndarray, routing_version: int | None = None, step: int | None = None) -> Verdict:
        """ACCEPT when every id's partition is served here, HOLD when the rest are on their way
        here; else raise Moved (nothing applied). ``step``: a sync request's step (see ``switch``)."""
        if not self.elastic:
            return Verdict.ACCEPT
        if self.switch is not None and step is not None and step >= self.switch[0]:
            if routing_version is None or routing_version < self.switch[1]:
                raise Moved(f"server {self.me}: from step {self.switch[0]} on the job routes by routing version "
                            f"{self.switch[1]}, this request is of version {routing_version}; fetch the routing "
                            f"(routing_get on server 0) and resend")
            if self.holding and self.incoming.any():
                return Verdict.HOLD
        if not len(ids):
            return Verdict.ACCEPT
        parts = self.partitions(ids)
        owned = self.owned[parts]
        if owned.all():
            return Verdict.ACCEPT
        if (owned | self.incoming[parts]).all():
            return Verdict.HOLD
        stray = np.unique(parts[~(owned | self.incoming[parts])])
        raise Moved(f"server {self.me} does not own partitions {stray[:5].tolist()} (routing version "
                    f"{self.routing.version}, the request's {routing_version}): they moved to another server; "
                    f"fetch the routing (routing_get on server 0) and resend")

    @property
    def held(self) -> list:
        return self.holds.held

    def hold(self, request) -> None:
        self.holds.hold(request)

    def take_held(self) -> list:
        return self.holds.take()

    def note_applied(self, table: str, ids: np.ndarray) -> None:
        """A request touched ``ids`` of ``table`` (rows made, updated, seen, counted)."""
        if len(ids) and self.copying.any():
            mine = self.copying[self.partitions(ids)]
            if mine.any():
                self.dirty[table].append(np.array(ids[mine], np.uint64))

    def dirty_ids(self, table: str, parts: np.ndarray) -> np.ndarray:
        chunks = self.dirty.get(table)
        if not chunks:
            return np.zeros(0, np.uint64)
        ids = np.unique(np.concatenate(chunks))
        self.dirty[table] = [ids]        # compacted: a long move does not sort its whole history again
        return ids[np.isin(self.partitions(ids), parts)]

    def forget_dirty(self, table: str, parts: np.ndarray) -> None:
        """``parts`` were handed over: their dirty ids are not needed again."""
        chunks = self.dirty.get(table)
        if chunks:
            ids = np.unique(np.concatenate(chunks))
            self.dirty[table] = [ids[~np.isin(self.partitions(ids), parts)]]

    # -- a move, step by step (launch/elastic/server_scaling.py drives it) --------------------
    def _check(self, parts, what: str) -> np.ndarray:
        parts = np.asarray(parts, np.int64)
        if not self.elastic:
            raise ConfigError("this job routes sparse ids by a fixed hash: servers cannot be added or removed; "
                              "start it with PARAMSHARD_PARTITIONS (e.g. 1024) to make it elastic")
        if len(parts) and (parts.min() < 0 or parts.max() >= self.routing.partitions):
            raise ConfigError(f"{what}: partitions must lie in [0, {self.routing.partitions})")
        return parts

    def set_routing(self, routing: Routing, join: bool = False) -> None:
        if routing.partitions != self.routing.partitions:
            raise ConfigError(f"routing of {routing.partitions} partitions for a server of {self.routing.partitions}")
        if routing.version < self.routing.version:
            raise ConfigError(f"routing version {routing.version} is older than this server's "
                              f"{self.routing.version}")
        if join:        # a server started to take partitions over: it serves none yet
            if self.owned.any() and self.routing.version > 0:
                raise ConfigError(f"server {self.me} already serves partitions: it cannot join again")
            self.owned[:] = False
            self.joined_at = routing.version + 1
        self.routing = routing

    def restore(self, routing: Routing) -> None:
        """A server restarted in place and restored from its replica (bounded-loss recovery): it
        owns what ``routing`` (the job's current one) gives it, and no move is under way here."""
        self.set_routing(routing)
        self.owned = routing.owners == self.me
        self.incoming[:] = self.copying[:] = self.lost[:] = False
        self.dirty.clear()
        self.holding = False

    def arm(self, step: int, version: int) -> None:
        """Sync mode: the routing changes at ``step`` (routing ``version``)."""
        if self.switch is not None and self.switch[1] > version:
            raise ConfigError(f"migrate_switch: routing version {version} is older than the one armed")
        self.switch = (step, version)
        self.holding = True

    def start_copy(self, parts) -> None:
        parts = self._check(parts, "migrate_start")
        if not self.owned[parts].all():
            raise ConfigError(f"migrate_start: server {self.me} does not own all of partitions {parts[:5].tolist()}..")
        self.copying[parts] = True

    def expecting(self) -> None:
        """A move is to hand partitions or blocks here, before it arms its own switch (if sync):
        an earlier move's switch holds nothing any more."""
        self.holding = False

    def expect(self, parts) -> None:
        parts = self._check(parts, "migrate_expect")
        self.expecting()
        if self.owned[parts].any():
            raise ConfigError(f"migrate_expect: server {self.me} already owns some of these partitions")
        self.incoming[parts] = True

    def freeze(self, parts) -> None:
        """Hand ``parts`` away: from now on requests for them are refused."""
        parts = self._check(parts, "handoff_freeze")
        if not (self.owned[parts] & self.copying[parts]).all():
            raise ConfigError(f"handoff_freeze: server {self.me} is not copying all of these partitions out")
        self.owned[parts] = False
        self.lost[parts] = True

    def frozen(self, parts) -> np.ndarray:
        parts = self._check(parts, "handoff_rows")
        if not self.lost[parts].all():
            raise ConfigError(f"handoff_rows: freeze partitions {parts[:5].tolist()}.. first (handoff_freeze)")
        return parts

    def adopt(self, parts) -> list:
        """The rows of ``parts`` are all here: serve them; the held requests, to run again."""
        parts = self._check(parts, "handoff_done")
        if not self.incoming[parts].all():
            raise ConfigError(f"handoff_done: server {self.me} was not expecting all of these partitions")
        self.incoming[parts] = False
        self.owned[parts] = True
        self.lost[parts] = False
        return self.take_held()

    def abort_incoming(self, parts) -> tuple[np.ndarray, list]:
        """An aborted move (the new owner's side): stop expecting ``parts``; (those of them served
        here, the held requests to run again: refused or held by what is left incoming)."""
        parts = self._check(parts, "migrate_abort")
        self.incoming[parts] = False
        return parts[self.owned[parts]], self.take_held()

    def undo_freeze(self, parts) -> np.ndarray:
        """An aborted move (the old owner's side): serve again the frozen ``parts`` that no new owner
        took (the coordinator knows which); the rest are skipped. Those taken back."""
        parts = self._check(parts, "handoff_undo")
        back = parts[self.lost[parts]]
        self.owned[back] = True
        self.lost[back] = False
        return back

    def finish(self) -> np.ndarray:
        """The move is over: the partitions whose rows to drop; tracking stops."""
        lost = self.lost.copy()
        self.lost[:] = False
        self.copying[:] = False
        self.dirty.clear()
        return lost

    def expired(self, timeout: float) -> list:
        """Held longer than ``timeout`` (the move stalled): stop expecting, run them again (refused)."""
        return self.holds.expired(timeout)

    def _stop_expecting(self) -> None:
        self.incoming[:] = False
