"""Ports for the ranks the launcher starts on this machine.

A port found free now is bound by its rank a moment later, by another process.
Anything that binds port 0 or connects out in between takes a port from the
kernel's ephemeral range (ip_local_port_range, typically 32768-60999), so a port
picked from that range (what bind(0) returns) can be gone by then: a test run
next to other jobs saw exactly that. Ports are therefore picked at random below
the ephemeral range, where only processes that ask for a port by number land.
"""
from __future__ import annotations

import random
import socket
from contextlib import ExitStack

LOWEST = 10000              # below: well-known and registered services' usual ports
RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def ephemeral_start() -> int:
    try:
        with open(RANGE_FILE) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768         # Linux's default


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct ports free right now on ``host``, outside the ephemeral range
    when there is room below it (else whatever bind(0) gives)."""
    top = ephemeral_start()
    rng = random.SystemRandom()
    with ExitStack() as stack:
        ports: list[int] = []
        tries = 0
        while len(ports) < count:
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            tries += 1
            port = rng.randrange(LOWEST, top) if top - LOWEST > 1000 and tries <= 50 * count else 0
            try:
                s.bind((host, port))
            except OSError:
                if port == 0:     # not even the kernel's choice: not an address of this machine
                    raise
                continue          # taken: another draw
            ports.append(s.getsockname()[1])
        return ports
