"""One memory budget per server, whatever the number of connections (PARAMSHARD_MAX_SERVER_BYTES).

Why: the per-connection bounds (ZMQ_MAXMSGSIZE, PARAMSHARD_MAX_QUEUED_BYTES: server/core/outbox.py)
multiply by the number of connections: 8 clients that do not read pinned 900 MB, three 600 MB
messages at once 1.7 GB. (A move's copied pages become rows of the table as they arrive,
server/elastic/partition_intake.py: the table's own memory, not a queue, so they are not counted here.)

What is counted, exactly as the loop knows it (``used``):

- **replies queued**: every byte libzmq has not released yet, over all connections (the
  outbox's running total);
- **requests held**: received and not yet handled, their bytes on arrival: those the outbox
  holds for a connection that does not read, and those a hook holds (requests for partitions
  a move brings here, pushes a checkpoint's cut holds back) until their frames are freed.

Requests answered later (``Deferred``: a sync step's barrier) are not counted: their number is
bounded by the trainers, and counting them could refuse the very push that completes the step.

Admission, before a request is decoded (``fits``): a request of ``n`` bytes is refused with
the error code ``busy`` when ``used + n`` passes the budget. A small request (at most
SMALL_REQUEST bytes: control ops, acknowledgements) is judged only by the replies queued and
the requests held for connections: hook-held requests are freed by small requests
(``handoff_done``, ``migrate_abort``, a checkpoint's resume), which must not wait for
themselves. The loop is single-threaded, so a request admitted
under the budget adds at most its own reply: the count stays under the budget plus one reply
(plus the small requests a hook held meanwhile; a request's bytes are at most PARAMSHARD_MAX_MESSAGE_BYTES; a reply is as big as what was
asked, e.g. a snapshot of the model; the budget is at least twice the largest message, so any
request fits once the connections' replies drain).
Clients retry a busy refusal after a short backoff until their deadline (transport/busy.py).

A client that does not read (raw TCP, a stopped process, a hostile one) would otherwise hold
its share of the budget for ever: libzmq keeps its replies until the connection ends, and a
peer that keeps sending never trips the heartbeat. So when a request would be refused, the
connections whose oldest reply has been waiting for STUCK_SECONDS are closed first
(``stuck``; the loop shuts their socket down, and libzmq frees what was queued to them), and
the request is judged again. A reading client's libzmq takes its replies off TCP as they come
(up to 1000 of them unread by the application), so a reply left there that long means the peer's
process reads nothing at all. Per-connection shares were the other choice: they leave every
connection a slice too small for one large message once there are many connections, and the
non-readers still pin theirs for ever.
"""
from __future__ import annotations

import weakref

SMALL_REQUEST = 64 << 10
STUCK_SECONDS = 10.0        # twice the heartbeat timeout: a peer whose libzmq reads would have taken it


class MemoryBudget:
    def __init__(self, limit: int, outbox):
        self.limit = limit
        self.outbox = outbox        # queued_total, held_total (server/core/outbox.py)
        self.hook_held = 0          # bytes of requests a hook holds, until their frames are freed
        self.peak = 0
        self.refused = 0
        self.evicted = 0

    # -- what is held -------------------------------------------------------------------------
    def used(self) -> int:
        return self.outbox.queued_total + self.outbox.held_total + self.hook_held

    def note_peak(self) -> None:
        self.peak = max(self.peak, self.used())

    def hold(self, frame, nbytes: int) -> None:
        """A hook keeps a request (``frame``: one of its frames): counted until that frame is freed."""
        self.hook_held += nbytes
        weakref.finalize(frame, self._release_hold, nbytes)

    def _release_hold(self, nbytes: int) -> None:
        self.hook_held -= nbytes

    # -- admission ----------------------------------------------------------------------------
    def fits(self, nbytes: int) -> bool:
        """Room for a request of ``nbytes`` (see the module docstring)?"""
        connections = self.outbox.queued_total + self.outbox.held_total
        if nbytes <= SMALL_REQUEST:
            return connections + nbytes <= self.limit
        return connections + self.hook_held + nbytes <= self.limit

    def busy_message(self, server_name: str, nbytes: int) -> str:
        return (f"{server_name} is busy: it holds {self.used()} bytes for its clients (replies queued "
                f"{self.outbox.queued_total}, requests held {self.outbox.held_total + self.hook_held}) "
                f"and this request of {nbytes} bytes would pass its memory budget "
                f"PARAMSHARD_MAX_SERVER_BYTES={self.limit}; retry shortly (clients do, until their deadline), or "
                f"raise PARAMSHARD_MAX_SERVER_BYTES on the servers")

    def stats(self) -> dict[str, int]:
        self.note_peak()
        return {"budget_bytes": self.limit, "budget_used_bytes": self.used(), "budget_peak_bytes": self.peak,
                "budget_held_bytes": self.outbox.held_total + self.hook_held,
                "requests_busy": self.refused, "connections_evicted": self.evicted}
