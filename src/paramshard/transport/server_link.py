"""One client connection to one server: a DEALER socket, the monitor socket that reports its
connection's events, and what they say (reached, handshaken, lost, refused).

A link counts as up only once its ZMTP handshake succeeded (a stopped process's kernel still
accepts TCP connections). ZeroMQ heartbeats catch a silent server (stopped or partitioned)
after HEARTBEAT_TIMEOUT_MS; a refusal (other keys, plain TCP against CurveZMQ) is told apart
from a server not up yet by the handshake's events (transport/links.py says what a request
does with either).
"""
from __future__ import annotations

import itertools
import os

import zmq
from zmq.utils.monitor import recv_monitor_message

from paramshard.transport.security import Security

HEARTBEAT_IVL_MS = 1000
HEARTBEAT_TIMEOUT_MS = 5000
_monitors = itertools.count(1)      # inproc endpoints of this process's monitors

_EVENTS = (zmq.EVENT_CONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
           | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
           | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
# A server with other keys closes the connection mid-handshake without a word
# (libzmq: HANDSHAKE_FAILED_NO_DETAIL); this many in a row, with no success in
# between, is a refusal. Reconnects come every ~0.1-0.2 s, so it takes < 1 s.
REFUSALS_IN_A_ROW = 3


class ServerLink:
    retired = False

    def __init__(self, ctx: zmq.Context, index: int, address: str, identity: bytes,
                 security: Security | None = None):
        self.index, self.address = index, address
        self.name = f"server {index} ({address})"
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.IDENTITY, identity)
        self.sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
        self.sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        self.curve = security is not None
        if security is not None:
            security.configure_client(self.sock)
        # libzmq's I/O thread blocks when a monitor pipe is full, and with it every
        # socket of the context: a link nobody polls any more (a failed Trainer()
        # its owner never closed) must not get there. Unbounded pipe: RCVHWM 0.
        endpoint = f"inproc://paramshard-monitor-{os.getpid()}-{next(_monitors)}"
        self.sock.monitor(endpoint, _EVENTS)
        self.monitor = ctx.socket(zmq.PAIR)
        self.monitor.setsockopt(zmq.RCVHWM, 0)
        self.monitor.connect(endpoint)
        self.sock.connect(f"tcp://{address}")
        self.reached = False        # a TCP connection was made at least once
        self.connected = False      # the ZMTP handshake succeeded and the connection has not dropped since
        self.ever_connected = False
        self.losses = 0             # connections lost after their handshake (heartbeat timeout, reset, close)
        self.failed_handshakes = 0  # in a row, since the last successful one
        self.refusal: str | None = None
        self.key_refused = False    # the server completed its half, then refused our key (ZAP)
        self.given_up = False       # disconnected for good after a refusal

    def poll_events(self) -> None:
        """Fold pending monitor events into the link's state."""
        while not self.monitor.closed and self.monitor.poll(0):
            message = recv_monitor_message(self.monitor)
            event, value = message["event"], message["value"]
            if event == zmq.EVENT_CONNECTED:
                self.reached = True     # TCP only: a stopped process's kernel accepts too
            elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.connected = self.ever_connected = True
                self.failed_handshakes = 0
                self.refusal = None
            elif event in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED):
                if self.connected:
                    self.losses += 1
                self.connected = False
            elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self.refusal = f"it did not accept this process's key (ZAP status {int(value)})"
                self.key_refused = True
            elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
                if int(value) == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
                    self.refusal = ("it speaks plain TCP and this process CurveZMQ"
                                    if self.curve else "it requires CurveZMQ and this process has no secret: plain TCP")
                else:
                    self.refusal = f"protocol error {int(value):#x} during the handshake"
            elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                self.failed_handshakes += 1
                if self.failed_handshakes >= REFUSALS_IN_A_ROW and self.refusal is None:
                    self.refusal = (f"it closed the connection during the handshake "
                                    f"{self.failed_handshakes} times in a row")

    def give_up(self) -> None:
        """Stop reconnecting (every ~0.1 s) to a server that refuses us: close the
        socket (libzmq's disconnect() does not stop a session that keeps failing
        its handshake). The link stays refused; closing it again is harmless."""
        if not self.given_up:
            self.given_up = True
            self.close()

    def close(self) -> None:
        if not self.sock.closed:
            close_monitored(self.sock, self.monitor)


class RetiredLink:
    """The place of a server a scale removed (its index stays; nothing to connect to or ask)."""
    retired = True
    sock = None
    connected = ever_connected = reached = False
    losses = 0
    refusal = None

    def __init__(self, index: int, address: str = ""):
        self.index, self.address = index, address
        self.name = f"server {index} (removed by a scale{', was ' + address if address else ''})"

    def poll_events(self) -> None:
        pass

    def close(self) -> None:
        pass


def close_monitored(sock: zmq.Socket, monitor: zmq.Socket) -> None:
    """Close a socket and its monitor without lingering (the monitor first, so
    libzmq has no event pipe left to block on)."""
    try:
        sock.disable_monitor()
    except zmq.ZMQError:
        pass
    monitor.close(0)
    sock.close(0)
