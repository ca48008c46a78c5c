"""A server's ``busy`` refusal, retried by the client (ServerLinks, transport/links.py).

A server refuses a request as busy, before decoding it, when its memory budget
(PARAMSHARD_MAX_SERVER_BYTES, server/core/memory_budget.py) cannot take it: nothing of it was applied,
so sending it again is always safe. The request stays pending on its ticket and goes again
after a backoff (doubling from FIRST_BACKOFF_S to MAX_BACKOFF_S, jittered so that many clients
refused together do not come back together), as often as needed until the ticket's deadline;
past it the deadline error names the server, how many times it refused, and its message (which
names the budget). Trainers and the move runner (client/move_runner.py: a move's pages all
arrive, later) get this through ServerLinks alone.
"""
from __future__ import annotations

import random
import time

FIRST_BACKOFF_S = 0.02
MAX_BACKOFF_S = 0.5


def backoff(attempt: int) -> float:
    """Seconds to wait before sending again a request refused ``attempt + 1`` times."""
    return min(MAX_BACKOFF_S, FIRST_BACKOFF_S * (2 ** min(attempt, 16))) * (0.5 + 0.5 * random.random())


class BusyRequests:
    """A ticket's requests refused as busy: request id -> (when to send again, refusals, last message)."""
    __slots__ = ("waiting", "refusals")

    def __init__(self):
        self.waiting: dict[int, tuple[float, str]] = {}
        self.refusals: dict[int, int] = {}     # slot -> times refused (carried over to the new request id)

    def __bool__(self) -> bool:
        return bool(self.waiting)

    def refused(self, request_id: int, slot: int, message: str) -> None:
        count = self.refusals.get(slot, 0)
        self.refusals[slot] = count + 1
        self.waiting[request_id] = (time.monotonic() + backoff(count), message)

    def due(self) -> list[int]:
        """The request ids whose backoff is over (each leaves the waiting list)."""
        now = time.monotonic()
        ready = [rid for rid, (when, _) in self.waiting.items() if when <= now]
        for rid in ready:
            del self.waiting[rid]
        return ready

    def next_ms(self) -> int | None:
        """Milliseconds until the next one is due (None: none waits)."""
        if not self.waiting:
            return None
        return max(0, int((min(when for when, _ in self.waiting.values()) - time.monotonic()) * 1000) + 1)

    def describe(self, request_id: int, slot: int) -> str | None:
        """Why a pending request has no answer yet, for the deadline error (None: not busy)."""
        if request_id not in self.waiting:
            return None
        return f"refused as busy {self.refusals.get(slot, 0)} times, last: {self.waiting[request_id][1]}"
