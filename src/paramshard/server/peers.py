"""A server's watch over the other servers of its job.

Each server holds one idle DEALER connection to every peer, with ZeroMQ
heartbeats. No message ever travels on it: the monitor events alone tell
when a peer's ZMTP handshake succeeded and when its connection dropped (a
killed process at once, a stopped or partitioned one after the heartbeat
timeout). A peer that was reachable and stays unreachable for the grace
period is gone, and a job missing a server cannot train on, so the server
stops too instead of idling forever.
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import zmq
from zmq.utils.monitor import recv_monitor_message

from ..transport.client import close_monitored

HEARTBEAT_IVL_MS = 1000
HEARTBEAT_TIMEOUT_MS = 5000
_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED


class _Peer:
    def __init__(self, index: int, address: str, sock: zmq.Socket):
        self.index, self.address, self.sock = index, address, sock
        self.monitor = sock.get_monitor_socket(_EVENTS)
        self.reachable = False
        self.ever_reachable = False
        self.down_since: float | None = None

    @property
    def name(self) -> str:
        return f"server {self.index} ({self.address})"


class PeerWatch:
    def __init__(self, ctx: zmq.Context, peers: dict[int, str], grace: float,
                 secure: Callable[[zmq.Socket], None] | None = None, clock=time.monotonic):
        """``peers``: server index -> host:port of every other server; ``secure``
        sets a socket's security options before it connects."""
        self.grace = grace
        self._clock = clock
        self.peers: list[_Peer] = []
        for index, address in sorted(peers.items()):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
            if secure is not None:
                secure(sock)
            peer = _Peer(index, address, sock)
            sock.connect(f"tcp://{address}")
            self.peers.append(peer)

    @property
    def monitors(self) -> Sequence[zmq.Socket]:
        return [p.monitor for p in self.peers]

    def poll(self) -> list[str]:
        """Names of peers gone for longer than the grace period (after having been reachable)."""
        now = self._clock()
        gone = []
        for peer in self.peers:
            while peer.monitor.poll(0):
                event = recv_monitor_message(peer.monitor)["event"]
                if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    peer.reachable = peer.ever_reachable = True
                    peer.down_since = None
                elif peer.reachable:
                    peer.reachable = False
                    peer.down_since = now
            if peer.down_since is not None and now - peer.down_since >= self.grace:
                gone.append(peer.name)
        return gone

    def close(self) -> None:
        for peer in self.peers:
            close_monitored(peer.sock, peer.monitor)
        self.peers = []
