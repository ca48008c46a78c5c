"""Client side of the wire: one DEALER socket per server, requests fanned out
to several servers at once and their replies gathered under one deadline.

Liveness: a monitor socket per server reports a dropped TCP connection (a
killed server) at once, and ZeroMQ heartbeats catch a silent peer; either way
the waiting call raises ServerUnavailable naming the server within seconds.
"""
from __future__ import annotations

import itertools
import os
import time
from typing import Sequence

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from ..errors import DeadlineExceeded, ProtocolError, RemoteError, ServerUnavailable
from . import protocol
from .auth import MessageAuth

HEARTBEAT_IVL_MS = 1000
HEARTBEAT_TIMEOUT_MS = 5000
_ids = itertools.count(1)


class _Link:
    def __init__(self, ctx: zmq.Context, index: int, address: str, identity: bytes):
        self.index, self.address = index, address
        self.name = f"server {index} ({address})"
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.IDENTITY, identity)
        self.sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
        self.sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        self.monitor = self.sock.get_monitor_socket(
            zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED)
        self.sock.connect(f"tcp://{address}")
        self.connected = False
        self.ever_connected = False

    def poll_events(self) -> None:
        """Fold pending monitor events into ``connected``."""
        while self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)["event"]
            if event == zmq.EVENT_CONNECTED:
                self.connected = self.ever_connected = True
            elif event in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED):
                self.connected = False

    def close(self) -> None:
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self.monitor.close(0)
        self.sock.close(0)


class ServerLinks:
    """Talks to every server of the job. Not thread-safe: one per trainer thread."""

    def __init__(self, addresses: Sequence[str], timeout: float, who: str = "trainer",
                 secret: str | None = None):
        self.timeout = timeout
        self.who = who
        self._auth = MessageAuth(secret)
        self._ctx = zmq.Context.instance()
        identity = f"{who}-{os.getpid()}-{next(_ids)}".encode()
        self.links = [_Link(self._ctx, i, a, identity) for i, a in enumerate(addresses)]
        self._poller = zmq.Poller()
        for link in self.links:
            self._poller.register(link.sock, zmq.POLLIN)

    def __len__(self) -> int:
        return len(self.links)

    def wait_ready(self, timeout: float = 30.0) -> list[dict]:
        """Block until every server answers (its hello), or raise naming the silent ones."""
        replies = self.request_many({s: ({"op": "hello"}, ()) for s in range(len(self.links))}, timeout)
        return [replies[s][0] for s in sorted(replies)]

    def request(self, server: int, header: dict, arrays: Sequence[np.ndarray] = (),
                timeout: float | None = None):
        return self.request_list([(server, header, arrays)], timeout)[0]

    def request_many(self, requests: dict, timeout: float | None = None) -> dict:
        """{server: (header, arrays)} -> {server: (reply_header, reply_arrays)}."""
        servers = list(requests)
        replies = self.request_list([(s, *requests[s]) for s in servers], timeout)
        return dict(zip(servers, replies))

    def request_list(self, requests: Sequence[tuple], timeout: float | None = None) -> list:
        """[(server, header, arrays)] -> [(reply_header, reply_arrays)], in order.

        All requests go out before any reply is awaited, so the servers work in
        parallel (and one server may get several). Reply arrays are read-only
        views over the received frames.
        """
        wait = self.timeout if timeout is None else timeout
        # A little past the servers' own deadline (the same PARAMSHARD_TIMEOUT),
        # so a server's error naming the peer it waited for arrives first.
        deadline = time.monotonic() + wait + min(5.0, 0.1 * wait + 1.0)
        pending: dict[int, tuple[int, int, str]] = {}   # request id -> (slot, server, op)
        for slot, (server, header, arrays) in enumerate(requests):
            request_id = next(_ids)
            frames = self._auth.sign(protocol.encode({**header, "id": request_id}, arrays,
                                                     signed=self._auth.enabled))
            self.links[server].sock.send_multipart(frames, copy=False)
            pending[request_id] = (slot, server, header.get("op"))
        results: list = [None] * len(requests)
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._raise_deadline(pending, wait)
            ready = dict(self._poller.poll(min(250, int(remaining * 1000) + 1)))
            for server in {srv for _, srv, _ in pending.values()}:
                if self.links[server].sock in ready:
                    self._receive(self.links[server], pending, results)
            self._check_alive(pending, results)
        return results

    def _receive(self, link: _Link, pending: dict, results: list) -> None:
        while any(srv == link.index for _, srv, _ in pending.values()):
            try:
                frames = link.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                frames = self._auth.verify(frames)
                header = protocol.decode_header(frames[0].buffer)
                self._auth.check_header(header)
            except ProtocolError as exc:
                # Most likely the server's own complaint about our signature: show it.
                header = protocol.decode_header(frames[0].buffer)
                if header.get("ok") is False:
                    raise RemoteError(link.name, str(header.get("code")),
                                      f"{header.get('message')} [and here: {exc}]") from None
                raise ProtocolError(f"reply from {link.name}: {exc}") from None
            entry = pending.pop(header["id"], None)
            if entry is None:
                continue   # a late answer to a request that already timed out
            if not header.get("ok"):
                raise RemoteError(link.name, str(header.get("code")), str(header.get("message")))
            results[entry[0]] = (header, protocol.decode_arrays(header, frames[1:]))

    def _check_alive(self, pending: dict, results: list) -> None:
        for server in {srv for _, srv, _ in pending.values()}:
            link = self.links[server]
            link.poll_events()
            if link.ever_connected and not link.connected:
                # A server that answered and then exited (the job ending) is fine:
                # take an answer already queued before calling it lost.
                self._receive(link, pending, results)
                if not any(srv == server for _, srv, _ in pending.values()):
                    continue
                raise ServerUnavailable(
                    f"{self.who} lost its connection to {link.name} while waiting for a reply: "
                    f"the server died or the network dropped; check that server's log, then "
                    f"restart the job")

    def _raise_deadline(self, pending: dict, waited: float) -> None:
        parts = []
        for _, server, op in pending.values():
            link = self.links[server]
            link.poll_events()
            state = "connected" if link.connected else (
                "never reachable: is it running, is the address right?" if not link.ever_connected
                else "disconnected")
            parts.append(f"{link.name} [{op}, {state}]")
        raise DeadlineExceeded(f"{self.who} waited {waited:g} s for " + "; ".join(parts)
                               + " (raise PARAMSHARD_TIMEOUT if the job is just slow)")

    def close(self) -> None:
        for link in self.links:
            link.close()
        self.links = []

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
