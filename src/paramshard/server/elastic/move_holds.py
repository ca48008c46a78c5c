"""The one queue of requests a move holds back on the server taking things over.

A request for a partition whose rows are on their way here (partition_ownership.py), or naming
a dense block on its way (dense_migration.py), waits here until they arrive; then every held
request is admitted again (``take``): held again if what it waits for is still coming, run or
refused otherwise. One queue for both: their releases and their expiry are the same.
If the oldest waited the server's timeout the move stalled: every service that expects
something stops expecting it (``on_expire``) and the held requests are admitted again, which
refuses them as moved, so the trainers fetch the routing and resend.

(The Outbox's per-connection backpressure queue, server/core/outbox.py, is another thing: it holds
a connection's requests in arrival order until that connection reads its replies, and
refuses them at the timeout naming the byte limit; folding the two together would tie a
trainer's backpressure to a move's arrival, so it stays separate.)
"""
from __future__ import annotations

import time
from typing import Callable


class MoveHolds:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.held: list = []
        self.since: float | None = None
        self.on_expire: list[Callable[[], None]] = []     # each stops expecting what it expected

    def __len__(self) -> int:
        return len(self.held)

    def hold(self, request) -> None:
        if self.since is None:
            self.since = self.clock()
        self.held.append(request)

    def take(self) -> list:
        held, self.held, self.since = self.held, [], None
        return held

    def expired(self, timeout: float) -> list:
        """Held longer than ``timeout`` (the move stalled): nothing is expected any more; the
        held requests, to admit again (refused)."""
        if self.since is None or self.clock() - self.since < timeout:
            return []
        for stop_expecting in self.on_expire:
            stop_expecting()
        return self.take()
