"""The server's listening socket: a ZeroMQ ROUTER bound to the address it was given.

With a Security (PARAMSHARD_SECRET or PARAMSHARD_KEYS_DIR) the socket is a
CurveZMQ server living in a context of its own, whose ZAP handler admits only
the job's client key (see security.py); closing the socket stops both.
"""
from __future__ import annotations

import threading

import zmq

from paramshard.errors import ConfigError
from paramshard.transport.security import CurveContext, Security

HEARTBEAT_IVL_MS = 1000
HEARTBEAT_TIMEOUT_MS = 5000


class CurveRouter(zmq.Socket):
    """A ROUTER socket that owns its private CurveZMQ context: ``close()`` also
    stops the ZAP handler and terminates the context (in the background, so a
    monitor socket still open elsewhere cannot block the caller)."""

    curve: CurveContext | None = None

    def close(self, linger: int | None = None) -> None:
        super().close(linger=linger)
        curve, self.curve = self.curve, None
        if curve is not None:
            threading.Thread(target=curve.close, name="curve-context-close", daemon=True).start()


def bind_router(ctx: zmq.Context, bind: str, name: str, max_message_bytes: int | None = None,
                security: Security | str | None = None) -> tuple[zmq.Socket, str]:
    """A bound ROUTER socket and the ``host:port`` it listens on (port 0 picks a free one).

    ``security``: None for plain TCP; a Security makes it a CurveZMQ server (then
    ``ctx`` is not used: ZAP is per context, so the socket gets a private one);
    a string is a secret with the default (empty) job id.
    """
    if isinstance(security, (str, bytes)):
        security = Security.from_secret(security) if security else None
    if security is not None:
        curve = security.server_context()
        sock = curve.context.socket(zmq.ROUTER, socket_class=CurveRouter)
        sock.curve = curve
        security.configure_server(sock)
    else:
        sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a reply to a vanished client raises, not drops
    # libzmq 4.3.5 aborts the whole process (`Assertion failed: !_io_error
    # (stream_engine_base.cpp:310)`) when a peer resets its connection while libzmq has
    # stopped reading it because its inbound pipe is full (RCVHWM): the next heartbeat,
    # or the PONG to a PING still in its buffer, writes to the dead connection. Any client
    # that sends faster than the loop answers and then hangs up gets there. With no
    # inbound limit libzmq never stops reading, so that state cannot arise; the loop
    # never blocks (sends are NOBLOCK) and bounds what each connection costs instead
    # (server/core/outbox.py).
    sock.setsockopt(zmq.RCVHWM, 0)
    # Heartbeats towards every client: a trainer behind a silent partition (no FIN,
    # no RST) is disconnected after the timeout, so the server counts it as lost.
    sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    if max_message_bytes is not None:
        sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)   # libzmq drops a bigger one before buffering it
    host, _, port = bind.rpartition(":")
    try:
        if port == "0":
            port_num = sock.bind_to_random_port(f"tcp://{host}")
        else:
            sock.bind(f"tcp://{host}:{port}")
            port_num = int(port)
    except zmq.ZMQError as exc:
        sock.close(0)
        raise ConfigError(f"{name} cannot bind {bind}: {exc} (port taken? wrong host?)") from None
    return sock, f"{host}:{port_num}"
