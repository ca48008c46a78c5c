"""Client side of the wire: one DEALER socket per server, requests fanned out
to several servers at once and their replies gathered under one deadline.

Liveness: a monitor socket per server reports a dropped connection (a killed
server) at once, and ZeroMQ heartbeats catch a silent one (a stopped or
partitioned server) after HEARTBEAT_TIMEOUT_MS; either way the waiting call
raises ServerUnavailable naming the server within seconds. A link counts as up
only once its ZMTP handshake succeeded (a stopped process's kernel still
accepts TCP connections), and any loss of the connection while a request is
pending fails that request, even when libzmq has reconnected since (one
server's socket and its events: transport/server_link.py; the calls every
client offers, ``Requests`` and its ``Ticket``: transport/requests.py).

Retired servers: a server a scale removed keeps its index (the job's routing names it "",
placement/partitions.Routing) but has nothing to connect to: its link is a placeholder
(``retire``, or ``add_server("")``), skipped by the calls that ask every server (``live``), and
a request for it fails at once naming it.

Security: with a Security (PARAMSHARD_SECRET / PARAMSHARD_KEYS_DIR) every
socket is a CurveZMQ client; a server that refuses our handshake fails the
call at once with HandshakeRefused, saying which setting to fix.

Busy servers: a request a server refused as ``busy`` (its memory budget is full) goes again
after a short backoff until the ticket's deadline (transport/busy.py).
"""
from __future__ import annotations

import itertools
import os
import threading
import time
from typing import Sequence

import numpy as np
import zmq

from paramshard.errors import Cancelled, DeadlineExceeded, ProtocolError, RemoteError, ServerUnavailable
from paramshard.transport import protocol
from paramshard.transport.busy import BusyRequests
from paramshard.transport.requests import Requests, RetryPolicy, Ticket
from paramshard.transport.security import FIX_HINT, HandshakeRefused, Security
from paramshard.transport.server_link import HEARTBEAT_TIMEOUT_MS, RetiredLink, ServerLink

_ids = itertools.count(1)       # request ids and socket identities of this process


class ServerLinks(Requests):
    """Talks to every server of the job. Not thread-safe: one per trainer thread."""

    def __init__(self, addresses: Sequence[str], timeout: float, who: str = "trainer",
                 security: Security | None = None):
        """``security``: the job's keys (``Security.from_env(env)``), None for plain TCP."""
        self.timeout = timeout
        self.who = who
        self.epoch = 0      # the job's epoch, carried by data requests (client/recovery.py)
        # Bounded-loss recovery (client/recovery.ServeAgain): a request a dead server did not
        # answer waits for its replacement and goes again. None: it fails (rollback recovery).
        self.retry: RetryPolicy | None = None
        self.security = security
        self._ctx: zmq.Context = zmq.Context.instance()
        identity = f"{who}-{os.getpid()}-{next(_ids)}".encode()
        self._identity = identity
        self.links: list[ServerLink | RetiredLink] = [
            ServerLink(self._ctx, i, a, identity, security) if a else RetiredLink(i) for i, a in enumerate(addresses)]
        self._inflight: dict[int, Ticket] = {}     # request id -> the ticket awaiting its reply
        self._retiring: set[int] = set()           # retired while a reply from it was awaited
        self._poller = zmq.Poller()
        for link in self.links:
            if isinstance(link, ServerLink):
                self._poller.register(link.sock, zmq.POLLIN)

    @classmethod
    def for_job(cls, env, who: str | None = None, timeout: float | None = None) -> "ServerLinks":
        """Links to the servers of ``env`` (a ClusterEnv) with its timeout and its
        security (PARAMSHARD_SECRET + PARAMSHARD_JOB_ID, or PARAMSHARD_KEYS_DIR). No retry
        policy: that is the client's (client/recovery.install), the wire has none of its own."""
        return cls(env.servers, env.timeout if timeout is None else timeout, who=who or env.rank_name,
                   security=Security.from_env(env))

    def __len__(self) -> int:
        return len(self.links)

    def add_server(self, address: str) -> int:
        """Talk to one more server (one added while the job runs); its index. ``""``: a server
        added and removed since this process started (a retired index: a placeholder)."""
        if not address:
            self.links.append(RetiredLink(len(self.links)))
            return len(self.links) - 1
        link = ServerLink(self._ctx, len(self.links), address, self._identity, self.security)
        self.links.append(link)
        self._poller.register(link.sock, zmq.POLLIN)
        return link.index

    def is_retired(self, server: int) -> bool:
        return 0 <= server < len(self.links) and self.links[server].retired

    def _link(self, server: int) -> ServerLink:
        """The link of a server a request of ours goes to or awaits: ``submit`` sends nothing to a
        retired one and ``retire`` keeps a link until no reply from it is awaited."""
        link = self.links[server]
        assert isinstance(link, ServerLink), f"{self.who}: {link.name} was retired while a reply from it was awaited"
        return link

    def retire(self, server: int) -> None:
        """Server ``server`` was removed by a scale: stop talking to it (its socket closes once no
        reply from it is awaited: an answer in flight, e.g. a refusal as moved, still arrives)."""
        if not 0 <= server < len(self.links) or self.links[server].retired:
            return
        self._retiring.add(server)
        self._close_retiring()

    def _close_retiring(self) -> None:
        awaited = {srv for ticket in self._inflight.values() for _, srv, _ in ticket.pending.values()}
        for server in sorted(self._retiring - awaited):
            link = self._link(server)   # retire() takes only servers that are not retired
            if not link.given_up:       # a given-up link left the poller already
                self._poller.unregister(link.sock)
            link.close()
            self.links[server] = RetiredLink(server, link.address)
            self._retiring.discard(server)

    def wait_ready(self, timeout: float = 30.0) -> list[dict]:
        """Block until every server not retired answers (its hello), or raise naming the silent ones."""
        replies = self.request_many({s: ({"op": "hello"}, ()) for s in self.live()}, timeout)
        return [replies[s][0] for s in sorted(replies)]

    def submit(self, requests: Sequence[tuple], timeout: float | None = None, retry: bool = True) -> "Ticket":
        """Send [(server, header, arrays)] now and return at once; ``collect(ticket)``
        gives the replies later. Several tickets may be out together (a push in
        flight while the next batch's rows are fetched); each has its own deadline.
        The arrays must not change until the ticket is collected (they are sent
        without copying)."""
        wait = self.timeout if timeout is None else timeout
        # A little past the servers' own deadline (the same PARAMSHARD_TIMEOUT),
        # so a server's error naming the peer it waited for arrives first.
        ticket = Ticket(len(requests), wait, time.monotonic() + wait + min(5.0, 0.1 * wait + 1.0))
        # ``retry=False``: the retry policy's own probes, which fail plainly.
        ticket.retry = retry and self.retry is not None
        # Connections lost before the requests go out; one more while they are
        # pending fails them, whatever libzmq reconnected since.
        for server in {server for server, _, _ in requests}:
            link = self.links[server]
            if not isinstance(link, ServerLink):
                raise ServerUnavailable(f"{self.who}: {link.name} is no server of the job any more; nothing is "
                                        f"sent to it (the caller's routing is older than the one that removed it: "
                                        f"fetch the routing from server 0)")
            link.poll_events()
            self._check_refused(link)   # before sending: a given-up link has no peer, a send would block
            ticket.losses[server] = link.losses
        for slot, (server, header, arrays) in enumerate(requests):
            request_id = next(_ids)
            link = self._link(server)   # the loop above raised for a retired one
            ticket.pending[request_id] = (slot, server, header.get("op"))
            self._inflight[request_id] = ticket
            ticket.sent[request_id] = (server, header, arrays)      # to send again (busy, bounded-loss)
            if ticket.retry:
                if link.ever_connected and not link.connected:
                    # Known dead: queue nothing for its replacement (it would get it on connecting, before
                    # or after its restore); collect waits for it to serve, then sends (bounded-loss).
                    ticket.resend[server] = ServerUnavailable(f"{self.who}: {link.name} is not connected")
                    continue
            try:
                self._send(link, protocol.encode({**header, "id": request_id}, arrays), ticket.deadline)
            except BaseException:
                for rid in ticket.pending:      # nothing of this ticket will be answered to anyone
                    self._inflight.pop(rid, None)
                raise
        return ticket

    def _send(self, link: "ServerLink", frames: list, deadline: float) -> None:
        """Queue one message on ``link`` without ever blocking past ``deadline``. A DEALER with no
        peer yet (its CurveZMQ handshake under way, or failing) takes no message: a plain send
        would wait there for ever if the handshake then fails, so the refusal is looked for while
        waiting (a multipart message is queued whole once its first part is)."""
        while True:
            try:
                link.sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
                return
            except zmq.Again:
                link.poll_events()
                self._check_refused(link)
                if time.monotonic() > deadline:
                    raise DeadlineExceeded(f"{self.who}: could not send to {link.name} in time: no connection to "
                                           f"it (is it up and listening there? is it this job's server?)") from None
                time.sleep(0.005)

    def collect(self, ticket: "Ticket", cancel: threading.Event | None = None) -> list:
        """Wait for every reply of ``ticket`` (until its deadline) and return them in
        request order; raises the first error reply, a lost server or the deadline.
        Replies to other tickets that arrive meanwhile are kept for them. ``cancel``
        set by another thread ends the wait within a poll slice (Cancelled): an
        observer that is told to stop must not wait out a deadline on a server
        that was stopped before it ever answered."""
        try:
            while ticket.pending and ticket.error is None:
                for server, cause in list(ticket.resend.items()):      # bounded-loss: once it serves again
                    self._resend(ticket, server, cause)
                for request_id in ticket.busy.due():
                    self._send_again(ticket, request_id)
                if cancel is not None and cancel.is_set():
                    raise Cancelled(f"{self.who} stopped waiting for {len(ticket.pending)} replies")
                remaining = ticket.deadline - time.monotonic()
                if remaining <= 0:
                    self._raise_deadline(ticket.pending, ticket.wait, ticket.busy)
                busy_ms = ticket.busy.next_ms()
                ready = dict(self._poller.poll(min(250, int(remaining * 1000) + 1,
                                                   busy_ms if busy_ms is not None else 250)))
                for link in self.links:
                    if isinstance(link, ServerLink) and link.sock in ready:
                        self._receive(link)
                lost = self._lost(ticket)       # raises a refusal (HandshakeRefused): no retry mends keys
                if lost is not None:
                    server, exc = lost
                    if not ticket.retry:
                        raise exc
                    ticket.resend[server] = exc
            if ticket.error is not None:
                raise ticket.error
            return ticket.results
        finally:
            self.discard(ticket)

    def poll_replies(self) -> None:
        """Take the replies that have arrived, without waiting (``Ticket.done`` then says
        which tickets need no wait)."""
        for link in self.links:
            if isinstance(link, ServerLink) and not link.sock.closed:
                self._receive(link)

    def discard(self, ticket: "Ticket") -> None:
        """Forget a ticket's outstanding requests: their late replies are dropped."""
        for request_id in ticket.pending:
            self._inflight.pop(request_id, None)
        ticket.pending.clear()
        ticket.sent.clear()
        if self._retiring:
            self._close_retiring()

    def _send_again(self, ticket: "Ticket", request_id: int) -> None:
        """A request refused as busy, once its backoff is over: the same request under a new id."""
        if request_id not in ticket.pending:
            return          # sent again already, to a restarted server (bounded-loss recovery)
        slot, server, op = ticket.pending.pop(request_id)
        self._inflight.pop(request_id, None)
        _, header, arrays = ticket.sent.pop(request_id)
        new_id = next(_ids)
        ticket.pending[new_id] = (slot, server, op)
        ticket.sent[new_id] = (server, header, arrays)
        self._inflight[new_id] = ticket
        self._send(self._link(server), protocol.encode({**header, "id": new_id}, arrays), ticket.deadline)

    def _receive(self, link: ServerLink) -> None:
        """Every reply waiting on ``link``, each filed with the ticket it answers."""
        while True:
            try:
                frames = link.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                header = protocol.decode_header(frames[0].buffer)
            except ProtocolError as exc:
                raise ProtocolError(f"reply from {link.name}: {exc}") from None
            ticket = self._inflight.pop(header["id"], None)     # decode_header checked it is an int
            if ticket is None:
                continue   # a late answer to a request that timed out or was discarded
            slot, server, op = ticket.pending.pop(header["id"])
            sent = ticket.sent.pop(header["id"], None)
            if not header.get("ok") and header.get("code") == "busy" and sent is not None:
                # Refused before anything was done (the server's memory budget): again after a backoff.
                ticket.pending[header["id"]] = (slot, server, op)
                ticket.sent[header["id"]] = sent
                self._inflight[header["id"]] = ticket
                ticket.busy.refused(header["id"], slot, str(header.get("message")))
                continue
            if not header.get("ok") and sent is not None and self.retry is not None:
                code = str(header.get("code"))
                if code == "applied" and header["id"] in ticket.replayed:
                    # The old server had it. A push that asked for values gets none: the caller
                    # pulls them (client/dense.py: DenseClient.scatter).
                    ticket.results[slot] = ({"ok": True, "replayed": True}, [])
                    continue
                if code in self.retry.codes:        # a restarted server not serving yet: again later
                    ticket.pending[header["id"]] = (slot, server, op)
                    ticket.sent[header["id"]] = sent
                    self._inflight[header["id"]] = ticket
                    ticket.resend[server] = RemoteError(link.name, code, str(header.get("message")))
                    continue
            if not header.get("ok"):
                if header.get("code") == "moved":      # a partition moved: the caller resends (client/sparse.py)
                    ticket.moved.append(slot)
                    continue
                if ticket.error is None:
                    ticket.error = RemoteError(link.name, str(header.get("code")), str(header.get("message")))
                continue
            ticket.results[slot] = (header, protocol.decode_arrays(header, frames[1:]))

    def _lost(self, ticket: "Ticket") -> tuple[int, ServerUnavailable] | None:
        """A server of ``ticket``'s pending requests whose connection was lost, and the error naming
        it (None: none was). A server that refuses the handshake raises HandshakeRefused here."""
        for server in {srv for _, srv, _ in ticket.pending.values()}:
            link = self._link(server)
            link.poll_events()
            self._check_refused(link)
            lost = link.losses > ticket.losses[server]
            if lost or (link.ever_connected and not link.connected):
                # A server that answered and then exited (the job ending) is fine:
                # take an answer already queued before calling it lost.
                self._receive(link)
                if not any(srv == server for _, srv, _ in ticket.pending.values()):
                    continue
                return server, ServerUnavailable(
                    f"{self.who} lost its connection to {link.name} while waiting for a reply: "
                    f"the server died, hung (no heartbeat for {HEARTBEAT_TIMEOUT_MS / 1000:g} s) or "
                    f"the network dropped; check that server's log, then restart the job")
        return None

    def _resend(self, ticket: "Ticket", server: int, cause: Exception) -> None:
        """Bounded-loss recovery: wait until ``server`` serves again (its replacement, restored from
        the launcher's replica), then send it the ticket's requests it did not answer, afresh."""
        # A ticket has resends only when submitted with a retry policy (ticket.retry).
        assert self.retry is not None, f"{self.who}: requests to resend, but no retry policy"
        self.retry.wait_serving(self, server, cause)       # raises, naming the server, past the deadline
        ticket.resend.pop(server, None)
        link = self.links[server]
        link.poll_events()
        ticket.losses[server] = link.losses
        for request_id in [r for r, (_, srv, _) in ticket.pending.items() if srv == server]:
            slot, _, op = ticket.pending.pop(request_id)
            self._inflight.pop(request_id, None)
            _, header, arrays = ticket.sent.pop(request_id)
            new_id = next(_ids)
            self._link(server).sock.send_multipart(protocol.encode({**header, "id": new_id}, arrays), copy=False)
            ticket.pending[new_id] = (slot, server, op)
            ticket.sent[new_id] = (server, header, arrays)
            ticket.replayed.add(new_id)
            self._inflight[new_id] = ticket
        ticket.deadline = time.monotonic() + ticket.wait + min(5.0, 0.1 * ticket.wait + 1.0)

    def _check_refused(self, link: ServerLink) -> None:
        if link.refusal is None or link.connected:
            return
        if not link.given_up:
            self._poller.unregister(link.sock)
            link.give_up()
        uses = self.security.origin if self.security else "no secret: plain TCP"
        if self.security is not None and not link.key_refused:
            # Only a holder of the job's server secret key can complete our half of the handshake:
            # a server that fails it is another job's, a stale address, or a fake one (published
            # e.g. in an engine's unauthenticated rendezvous store) -- or the keys differ.
            raise HandshakeRefused(
                f"{self.who} cannot talk to {link.name}: it failed CurveZMQ authentication ({link.refusal}): it "
                f"does not hold this job's server key, so it is not this job's server (a stale or fake address) "
                f"or it was started with other keys; {FIX_HINT} (this process uses {uses})")
        raise HandshakeRefused(
            f"{self.who} cannot talk to {link.name}: the server refused the connection "
            f"handshake ({link.refusal}); {FIX_HINT} (this process uses {uses})")

    def _raise_deadline(self, pending: dict, waited: float, busy: BusyRequests | None = None) -> None:
        parts = []
        for request_id, (slot, server, op) in pending.items():
            link = self.links[server]
            link.poll_events()
            refused = busy.describe(request_id, slot) if busy is not None else None
            state = refused if refused is not None else "connected" if link.connected else (
                "disconnected" if link.ever_connected else
                "reachable, but its handshake never completed (hung?)" if link.reached else
                "never reachable: is it running, is the address right?")
            parts.append(f"{link.name} [{op}, {state}]")
        raise DeadlineExceeded(f"{self.who} waited {waited:g} s for " + "; ".join(parts)
                               + " (raise PARAMSHARD_TIMEOUT if the job is just slow)")

    def close(self) -> None:
        for link in self.links:
            link.close()
        self.links = []
        self._inflight.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def check_reply_arrays(header: dict, arrays: list, expected: Sequence[int], what: str) -> None:
    if len(arrays) != len(expected):
        raise ProtocolError(f"{what}: expected {len(expected)} arrays in the reply, got {len(arrays)}")
    for arr, size in zip(arrays, expected):
        if arr.size != size:
            raise ProtocolError(f"{what}: reply array of {arr.size} elements where {size} were expected")
