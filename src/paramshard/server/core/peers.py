"""A server's watch over the other servers of its job.

Each server holds one idle DEALER connection to every peer, with ZeroMQ
heartbeats. No message ever travels on it: the monitor events alone tell
when a peer's ZMTP handshake succeeded and when its connection dropped (a
killed process at once, a stopped or partitioned one after the heartbeat
timeout). A peer that was reachable and stays unreachable for the grace
period is gone, and a job missing a server cannot train on, so the server
stops too instead of idling forever, with ``PEER_LOST_EXIT_CODE`` (it failed
because another one did).

Under a launcher that reads its stdout (``PARAMSHARD_RECORDS=stdout``) the watch
also writes status lines (messages/status_lines.py): which peers are unreachable or not
reached yet, at once when that changes and every second otherwise. The launcher learns of a
hung peer as soon as its heartbeat is lost, while the trainers (who lose it on
the same heartbeat) wait for it to come back, and can replace it in time.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Callable, Sequence

import zmq
from zmq.utils.monitor import recv_monitor_message

from paramshard.messages.status_lines import PEER_LOST_EXIT_CODE, STATUS_EVERY, PeerStatus
from paramshard.settings.table import by_field
from paramshard.transport.server_link import HEARTBEAT_IVL_MS, HEARTBEAT_TIMEOUT_MS, close_monitored

__all__ = ["PEER_LOST_EXIT_CODE", "PeerWatch", "launcher_report"]

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


def launcher_report() -> Callable[[str], None] | None:
    """Where status lines go: this process's stdout when a launcher reads it and takes
    marked lines out (``PARAMSHARD_RECORDS=stdout``, set by ``paramshard launch``), else
    nowhere (a user's terminal, ``paramshard run``, Kubernetes logs)."""
    if by_field("records").read(os.environ) != "stdout":
        return None

    def write(line: str) -> None:
        try:
            sys.stdout.write(line)
            sys.stdout.flush()
        except (OSError, ValueError):
            pass          # the launcher's pipe is gone: nobody to tell
    return write


class PeerWatch:
    def __init__(self, ctx: zmq.Context, peers: dict[int, str], grace: float,
                 secure: Callable[[zmq.Socket], None] | None = None, clock=time.monotonic,
                 me: int | None = None, report: Callable[[str], None] | None = None):
        """``peers``: server index -> host:port of every other server; ``secure``
        sets a socket's security options before it connects. ``me``: this server's
        index; with it, status lines go to ``report`` (default: ``launcher_report()``)."""
        self.grace = grace
        self._clock = clock
        self.me = me
        self._report = (report or launcher_report()) if me is not None else None
        self._reported: tuple[float, frozenset[int], frozenset[int]] | None = None   # (when, unreachable, unseen) last said
        self._said: PeerStatus | None = None        # the last status line written
        self._ctx, self._secure = ctx, secure
        self.peers: list[_Peer] = []
        for index, address in sorted(peers.items()):
            self.peers.append(self._connect(index, address))

    def _connect(self, index: int, address: str) -> _Peer:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        if self._secure is not None:
            self._secure(sock)
        peer = _Peer(index, address, sock)
        sock.connect(f"tcp://{address}")
        return peer

    def follow(self, addresses: Sequence[str], watch: Callable[[zmq.Socket], None] = lambda m: None,
               unwatch: Callable[[zmq.Socket], None] = lambda m: None) -> None:
        """The job's servers as a routing names them (every index it had, "" for one a scale
        removed): watch the servers added since, stop watching the removed ones, which exit
        once no trainer needs them and are no loss. ``watch``/``unwatch``: told of each peer's
        monitor socket before it is used or closed (the server's poller)."""
        by_index = {p.index: p for p in self.peers}
        for index, address in enumerate(addresses):
            if index == self.me:
                continue
            peer = by_index.get(index)
            if not address and peer is not None:
                unwatch(peer.monitor)
                close_monitored(peer.sock, peer.monitor)
                self.peers.remove(peer)
            elif address and peer is None:
                peer = self._connect(index, address)
                self.peers.append(peer)
                watch(peer.monitor)
        self.peers.sort(key=lambda p: p.index)

    @property
    def monitors(self) -> Sequence[zmq.Socket]:
        return [p.monitor for p in self.peers]

    def never_reached(self) -> list[str]:
        """Names of the peers this server never completed a handshake with (not up yet, a
        wrong address, another secret): what a server that nothing reached names on exit."""
        return [peer.name for peer in self.peers if not peer.ever_reachable]

    def poll(self) -> list[str]:
        """Names of peers gone for longer than the grace period (after having been reachable)."""
        return [peer.name for peer in self._poll()]

    def _poll(self) -> list[_Peer]:
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
                gone.append(peer)
        self._write_status(now, gone)
        return gone

    def _write_status(self, now: float, gone: list[_Peer]) -> None:
        """A status line when the unreachable peers changed, when some are gone (this
        server is about to exit for them) and every STATUS_EVERY seconds: the launcher
        counts a server that stops writing them as silent (launch/supervision/peer_loss.py)."""
        report, me = self._report, self.me          # a report is set only with ``me``
        if report is None or me is None or not self.peers:
            return
        down = {p.index: now - p.down_since for p in self.peers if p.down_since is not None}
        unseen = tuple(p.index for p in self.peers if not p.ever_reachable)
        last = self._reported
        if (last is not None and not gone and frozenset(down) == last[1] and frozenset(unseen) == last[2]
                and now - last[0] < STATUS_EVERY):
            return
        self._reported = (now, frozenset(down), frozenset(unseen))
        self._said = PeerStatus(me, down, tuple(p.index for p in gone), unseen)
        report(self._said.line())

    def close(self) -> None:
        """Stop watching. A server that wrote status lines says, in one last line, that it stops
        (what it said last, ``stopping`` set): the launcher, which counts a server silent for a few
        seconds and named by a peer as hung, then knows its silence is its exit (messages/status_lines.py)."""
        if self._report is not None and self._said is not None:
            self._report(dataclasses.replace(self._said, stopping=True).line())
            self._said = None
        for peer in self.peers:
            close_monitored(peer.sock, peer.monitor)
        self.peers = []
