"""Hosts of a many-machine job and where each rank goes (pure: no I/O but reading a hosts file).

A host is written ``[user@]host[:port] [slots=N]``, in a comma list or a file
with one a line (``#`` starts a comment). ``host`` is both what ssh connects
to and the address the ranks placed there advertise, so give an address (or
a name) that every other host can reach, never an alias only your own ssh
config knows.

Hosts and users reach ssh and rsync as command-line words, so neither may start
with ``-`` (``-oProxyCommand=...`` would be read as an option and run a command)
nor hold shell metacharacters (a ProxyCommand's ``%h``/``%r`` go through a shell):
names are letters, digits, ``.``, ``_`` and ``-``. Older OpenSSH clients do not
check this themselves.
"""
from __future__ import annotations

import dataclasses
import os
import re

from paramshard.errors import ConfigError

_HOST = re.compile(r"^(?:(?P<user>[^@\s:]+)@)?(?P<host>\[[0-9a-fA-F:.]+\]|[^@\s:\[\]]+)(?::(?P<port>\d+))?$")
# What a host name or user may be: never an option (a leading "-"), never shell syntax.
_NAME = re.compile(r"^[A-Za-z0-9._][A-Za-z0-9._-]*$")
_IPV6 = re.compile(r"^\[[0-9a-fA-F:.]+\]$")


def check_name(what: str, value: str) -> None:
    """Refuse a host or user that ssh or rsync could take for an option, or a shell for syntax."""
    if value.startswith("-"):
        raise ConfigError(f"{what} {value!r} starts with '-', which ssh and rsync would read as an option: "
                          f"give a {what} name{' or address' if what == 'host' else ''}")
    if not _NAME.match(value):
        raise ConfigError(f"{what} {value!r}: a {what} name may hold only letters, digits, '.', '_' and '-' "
                          f"(ssh hands it to ProxyCommand shells)")


@dataclasses.dataclass(frozen=True)
class Host:
    host: str                   # address or name, as ssh and the other hosts see it
    user: str | None = None
    port: int | None = None     # ssh port
    slots: int | None = None    # most ranks placed here (None: no limit)

    def __post_init__(self):
        # Here, not only in parse_host: every Host reaches ssh's and rsync's command lines.
        if not _IPV6.match(self.host):
            check_name("host", self.host)
        if self.user is not None:
            check_name("user", self.user)

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
    port = int(m["port"]) if m["port"] else None
    if port is not None and not 0 < port < 65536:
        raise ConfigError(f"host {parts[0]!r}: port {port} out of range")
    host = Host(m["host"], m["user"], port)      # refuses an option-like host or user first
    slots = None
    for extra in parts[1:]:
        key, sep, value = extra.partition("=")
        if key != "slots" or not sep or not value.isdigit() or int(value) < 1:
            raise ConfigError(f"host {text.strip()!r}: {extra!r} is not slots=N with N >= 1")
        slots = int(value)
    return dataclasses.replace(host, slots=slots)


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
    out: list[Host] = []
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
