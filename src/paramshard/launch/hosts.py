"""Hosts of a many-machine job and where each rank goes (pure: no I/O but reading a hosts file).

A host is written ``[user@]host[:port] [slots=N]``, in a comma list or a file
with one a line (``#`` starts a comment). ``host`` is both what ssh connects
to and the address the ranks placed there advertise, so give an address (or
a name) that every other host can reach, never an alias only your own ssh
config knows.
"""
from __future__ import annotations

import dataclasses
import os
import re

from ..errors import ConfigError

_HOST = re.compile(r"^(?:(?P<user>[^@\s:]+)@)?(?P<host>\[[0-9a-fA-F:.]+\]|[^@\s:\[\]]+)(?::(?P<port>\d+))?$")


@dataclasses.dataclass(frozen=True)
class Host:
    host: str                   # address or name, as ssh and the other hosts see it
    user: str | None = None
    port: int | None = None     # ssh port
    slots: int | None = None    # most ranks placed here (None: no limit)

    @property
    def target(self) -> str:
        """user@host for ssh and rsync."""
        return f"{self.user}@{self.host}" if self.user else self.host

    @property
    def address(self) -> str:
        """The address ranks on this host bind and advertise (brackets off an IPv6 literal)."""
        return self.host.strip("[]")

    def __str__(self) -> str:
        return self.host


def parse_host(text: str) -> Host:
    parts = text.split()
    if not parts:
        raise ConfigError("empty host entry")
    m = _HOST.match(parts[0])
    if not m:
        raise ConfigError(f"host {parts[0]!r}: expected [user@]host[:port]")
    slots = None
    for extra in parts[1:]:
        key, sep, value = extra.partition("=")
        if key != "slots" or not sep or not value.isdigit() or int(value) < 1:
            raise ConfigError(f"host {text.strip()!r}: {extra!r} is not slots=N with N >= 1")
        slots = int(value)
    port = int(m["port"]) if m["port"] else None
    if port is not None and not 0 < port < 65536:
        raise ConfigError(f"host {parts[0]!r}: port {port} out of range")
    return Host(m["host"], m["user"], port, slots)


def parse_hosts(spec: str) -> list[Host]:
    """A comma list, or the path of a file with one host a line."""
    if os.path.isfile(spec):
        with open(spec, encoding="utf-8") as f:
            lines = [line.split("#", 1)[0].strip() for line in f]
        entries = [line for line in lines if line]
        where = f"hosts file {spec!r}"
    else:
        entries = [e.strip() for e in spec.split(",") if e.strip()]
        where = f"--hosts {spec!r}"
    if not entries:
        raise ConfigError(f"{where} names no host")
    hosts = [parse_host(e) for e in entries]
    seen = set()
    for h in hosts:
        if h.target in seen:
            raise ConfigError(f"{where} names {h.target} twice; use slots=N for several ranks on one host")
        seen.add(h.target)
    return hosts


def place(count: int, hosts: list[Host], used: dict[str, int], what: str) -> list[Host]:
    """Spread ``count`` ranks over ``hosts``: each goes to the host with the fewest
    ranks so far (first in the list on a tie) that still has a free slot.
    ``used`` (host -> ranks placed) is updated."""
    out = []
    for _ in range(count):
        free = [h for h in hosts if h.slots is None or used.get(h.target, 0) < h.slots]
        if not free:
            capacity = sum(h.slots or 0 for h in hosts)
            raise ConfigError(f"no free slot for {what} {len(out)}: hosts {[str(h) for h in hosts]} have "
                              f"{capacity} slots in all; add hosts or raise slots=N")
        best = min(free, key=lambda h: used.get(h.target, 0))
        used[best.target] = used.get(best.target, 0) + 1
        out.append(best)
    return out


def placement(servers: int, trainers: int, hosts: list[Host], server_hosts: list[Host] | None = None,
              trainer_hosts: list[Host] | None = None) -> tuple[list[Host], list[Host]]:
    """Servers first, one per host while possible; then trainers on the least loaded hosts."""
    used: dict[str, int] = {}
    on_servers = place(servers, server_hosts or hosts, used, "server")
    on_trainers = place(trainers, trainer_hosts or hosts, used, "trainer")
    return on_servers, on_trainers
