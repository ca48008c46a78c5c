"""What one connection may make a server hold: its unread replies, and its requests held back.

Why: a ROUTER queues up to SNDHWM (1000) replies per connection. A client that sends
requests with big replies (``snapshot_dense`` of the model) and never reads them makes
the server hold 1000 copies of the model, and a blocking send to it stalls the loop.

Design (exact accounting, no guess about what the client did):

- **Bytes held for a connection** are the replies libzmq has not released yet. libzmq
  moves one connection's messages out in order (one pipe, one TCP stream) and frees each
  once it is written to the kernel, or dropped with the connection; so once the last
  frame of a reply is released, that reply and every earlier one are gone. The last
  frame of a reply is sent zero-copy with a MessageTracker whenever the bytes sent to
  the connection since its last tracked reply reach TRACK_BYTES (tracking costs a
  round trip through pyzmq's garbage-collector thread, too slow for every 50-byte push
  acknowledgement); the untracked tail, under TRACK_BYTES, is counted as queued until
  a later tracked reply is released. Counting "delivered when the peer sends its next
  request" would be unsound: a client that pipelines requests (a trainer with pushes in
  flight and prefetches; or an abuser) sends the next request before reading anything.
- **Backpressure, not refusal**: a request from a connection over ``max_queued_bytes``
  (PARAMSHARD_MAX_QUEUED_BYTES) is held, in arrival order behind any request of that
  connection already held, and handled once its replies drain below the limit. A
  trainer that reads its replies, however slowly, or after one reply bigger than the
  limit, is therefore served, never refused. A held request is refused (an error naming
  the limit) once it waited the server's timeout, and a new one is refused at once when
  the connection already has MAX_HELD requests held. Held requests are not bounded in
  bytes: a trainer's held pushes can be as big as its model, and refusing them would
  refuse a trainer that reads.
- A connection found gone (a reply to it finds no peer) has its held requests dropped
  unanswered: a client that hung up with a thousand snapshot requests held must not
  cost the loop a thousand snapshots nobody reads.
- **The bound**: one connection makes a server hold at most ``max_queued_bytes`` + one
  reply (the last one admitted under the limit) of replies, MAX_HELD requests it sent
  (memory their bytes took on arrival anyway), and error replies of a few hundred bytes each (at most
  SNDHWM of them: a send to a full pipe is dropped, see ``ParameterServer._send``).
  An entry whose replies are all released, or whose untracked tail saw no new reply for
  QUIET_SECONDS, is forgotten (clients come and go): a client that tries to slip
  untracked replies past the count that way leaves at most SNDHWM x TRACK_BYTES (16 MB),
  at one reply per QUIET_SECONDS.
"""
from __future__ import annotations

import collections
import time

import zmq

from paramshard.messages.server_stats import Connections

# Requests one connection may have held back. A trainer has a handful outstanding per
# server (pushes in flight, prefetches); more is a client that does not read.
MAX_HELD = 1024
TRACK_BYTES = 16 << 10
QUIET_SECONDS = 1.0

GO, HELD, REFUSED = "go", "held", "refused"


def describe_identity(identity: bytes) -> str:
    """A client's routing id for a log line: our clients name themselves (``trainer 0-123-4``);
    libzmq's automatic ids are 5 binary bytes."""
    try:
        text = identity.decode("ascii")
        if text.isprintable():
            return text
    except UnicodeDecodeError:
        pass
    return "0x" + identity.hex()


class _Connection:
    __slots__ = ("box", "sent", "tail", "queued", "last_sent", "held", "held_bytes", "gone", "warned_drop",
                 "warned_refuse", "fd")

    def __init__(self, box: "Outbox"):
        self.box = box      # its running totals (the server-wide budget reads them: memory_budget.py)
        self.fd = -1        # the descriptor of the connection its last request came over (libzmq's SRCFD)
        # (tracker, bytes of the tracked reply and the untracked ones before it, when sent), oldest first
        self.sent: collections.deque = collections.deque()
        self.tail = 0                                          # bytes of untracked replies after the last tracked one
        self.queued = 0                                        # every byte not known released (tail included)
        self.last_sent = 0.0
        self.held: collections.deque = collections.deque()    # (deadline, frames, nbytes)
        self.held_bytes = 0
        self.gone = False       # a send found no such peer: its held requests have nobody to answer
        self.warned_drop = self.warned_refuse = False          # one warning per episode, not per message

    def prune(self) -> int:
        """Forget the replies libzmq has released (they go in order); the bytes still queued."""
        sent = self.sent
        while sent and sent[0][0].done:
            nbytes = sent.popleft()[1]
            self.queued -= nbytes
            self.box.queued_total -= nbytes
        return self.queued

    def waiting_since(self) -> float | None:
        """When the oldest reply libzmq still holds was sent (None: none tracked)."""
        return self.sent[0][2] if self.prune() and self.sent else None

    def forgettable(self, now: float) -> bool:
        return not self.held and self.prune() == 0 or (not self.sent and not self.held
                                                       and now - self.last_sent >= QUIET_SECONDS)


class Outbox:
    """Per-connection replies in flight and requests held back (see the module docstring)."""

    def __init__(self, max_queued_bytes: int, hold_seconds: float):
        self.max_queued_bytes = max_queued_bytes
        self.hold_seconds = hold_seconds
        self._conns: dict[bytes, _Connection] = {}
        self._holding: set[bytes] = set()      # connections with held requests
        self.queued_total = 0                  # bytes of replies not known released, every connection
        self.held_total = 0                    # bytes of requests held, every connection

    def __len__(self) -> int:
        return len(self._conns)

    def connection(self, identity: bytes) -> _Connection:
        conn = self._conns.get(identity)
        if conn is None:
            conn = self._conns[identity] = _Connection(self)
        return conn

    def queued(self, identity: bytes) -> int:
        conn = self._conns.get(identity)
        return conn.prune() if conn is not None else 0

    def admit(self, identity: bytes, frames: list, nbytes: int) -> str:
        """GO: handle the request now. HELD: kept for ``releasable``. REFUSED: answer with
        ``refusal`` at once."""
        conn = self._conns.get(identity)
        if conn is None or (not conn.held and conn.prune() <= self.max_queued_bytes):
            return GO
        conn.gone = False      # it speaks: the same id reconnected (a send will tell otherwise)
        if len(conn.held) >= MAX_HELD:
            return REFUSED
        conn.held.append((time.monotonic() + self.hold_seconds, frames, nbytes))
        conn.held_bytes += nbytes
        self.held_total += nbytes
        self._holding.add(identity)
        return HELD

    def has_held(self) -> bool:
        return bool(self._holding)

    def release(self, handle, refuse, drop) -> bool:
        """Hand the oldest held request of each connection that drained below the limit to
        ``handle`` (one per connection per call: its reply is counted before the next goes, and
        other clients are served in between), every one past its deadline to ``refuse``, and
        every one of a connection found gone to ``drop``. True when it handled one (call again soon)."""
        now = time.monotonic()
        handled = False
        for identity in list(self._holding):
            conn = self._conns[identity]
            while conn.held:
                deadline, frames, nbytes = conn.held[0]
                if conn.gone:
                    act = drop
                elif conn.prune() <= self.max_queued_bytes:
                    act = handle
                elif now >= deadline:
                    act = refuse
                else:
                    break
                conn.held.popleft()
                conn.held_bytes -= nbytes
                self.held_total -= nbytes
                act(frames)
                if act is handle:
                    handled = True
                    break
            if not conn.held:
                self._holding.discard(identity)
        return handled

    def track(self, identity: bytes, nbytes: int) -> bool:
        """Should the reply of ``nbytes`` about to go to ``identity`` be tracked?"""
        conn = self._conns.get(identity)
        # Under a tiny limit too, the untracked tail alone must never keep a connection over it.
        return (conn.tail if conn is not None else 0) + nbytes >= min(TRACK_BYTES, self.max_queued_bytes)

    def sent(self, identity: bytes, tracker: zmq.MessageTracker | None, nbytes: int) -> None:
        conn = self.connection(identity)
        now = time.monotonic()
        if tracker is None:
            conn.tail += nbytes
        else:
            conn.sent.append((tracker, conn.tail + nbytes, now))
            conn.tail = 0
        conn.queued += nbytes
        self.queued_total += nbytes
        conn.last_sent = now

    def sweep(self) -> None:
        """Forget connections with nothing in flight (see the module docstring)."""
        now = time.monotonic()
        for identity in [i for i, c in self._conns.items() if c.forgettable(now)]:
            self.queued_total -= self._conns.pop(identity).queued     # an untracked tail, if anything

    def note_fd(self, identity: bytes, fd: int) -> None:
        """The connection ``identity``'s requests come over (from its first request on: a client
        that sends one request with a large reply and never reads can be closed too)."""
        self.connection(identity).fd = fd

    def stuck(self, seconds: float) -> list[tuple[bytes, int, int]]:
        """(identity, descriptor, bytes queued) of the connections whose oldest reply libzmq has held
        for ``seconds`` or more, most bytes first: peers that read nothing (memory_budget.py)."""
        now = time.monotonic()
        found = [(identity, c.fd, c.queued) for identity, c in list(self._conns.items())
                 if (since := c.waiting_since()) is not None and now - since >= seconds]
        return sorted(found, key=lambda f: -f[2])

    def refusal(self, identity: bytes, server_name: str) -> str:
        conn = self._conns.get(identity)
        queued = conn.queued if conn is not None else 0
        return (f"{server_name} refused a request: this connection has {queued} bytes of replies it has not "
                f"read (limit PARAMSHARD_MAX_QUEUED_BYTES={self.max_queued_bytes}) and "
                f"{len(conn.held) if conn else 0} requests waiting behind them; read the replies before "
                f"sending more requests, or raise PARAMSHARD_MAX_QUEUED_BYTES on the servers")

    def stats(self) -> Connections:
        conns = list(self._conns.values())     # a snapshot: a test thread may ask while the loop runs
        return Connections(len(conns), sum(c.queued for c in conns), sum(len(c.held) for c in conns))
