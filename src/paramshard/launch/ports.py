from __future__ import annotations

import socket
from contextlib import ExitStack


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Ports free right now on ``host`` (all held open together, so distinct)."""
    with ExitStack() as stack:
        ports = []
        for _ in range(count):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind((host, 0))
            ports.append(s.getsockname()[1])
        return ports
