"""Where the new ranks of a running SSH job go, and hosts added to it while it runs (ssh.SshHosts, the
SSH job's Placement, hands these to this once the hosts were probed).

- A rank started mid-job (a trainer that joins: launch/elastic/elastic_trainers.py; a server a scale adds:
  launch/elastic/elastic_servers.py) goes to the least loaded host of the job: the fewest live ranks,
  first in the job's order on a tie, ``slots=N`` respected (hosts.place, the start-up rule),
  among the hosts its role may use (``--server-hosts`` / ``--trainer-hosts``, else ``--hosts``)
  and every host added since. A new server's port is asked of its host: a one-shot probe over
  ssh (launch/ssh.probe), as at start-up, so it is free there, not here. ``scale --servers N
  --on HOST`` names the host instead (one of the job's hosts for servers, or an added one).
- ``add_host(text)`` (``paramshard scale RUN_DIR --add-host HOST``): the host is probed (ssh
  works, the remote Python answers) and the workspace copied there when the job dispatches one
  and that machine has no copy yet (hosts on one machine share its file system); from then on it
  is one of the job's hosts for both roles and, running nothing, the first choice of the next
  new rank. Nothing moves to it by itself: ``scale --trainers`` / ``--servers`` put ranks there.
- ``remove_host(host)`` (``scale --remove-host HOST``, once its ranks were asked to go:
  launch/elastic/host_removal.py): the host leaves both pools, so no rank started later goes there; it stays
  an engine host (its ranks still running there are stopped through it).

The probe and the copy run in the launcher's loop (a request is answered when they end: a few
seconds, or the copy's time for a large workspace the first time).
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Iterable

from paramshard.errors import ConfigError
from paramshard.log import get_logger
from paramshard.launch.api import RankSpec
from paramshard.launch.engines.hosts import Host, parse_host, place

log = get_logger("launch")


class SshPlacement:
    def __init__(self, hosts: list[Host], server_hosts: list[Host] | None, trainer_hosts: list[Host] | None, *,
                 engine_hosts: dict[str, Host], machines: Iterable[str], live_hosts: Callable[[], list[str]],
                 probe: Callable, dispatch: Callable | None, record: Callable[..., None] = lambda *a, **f: None):
        """``engine_hosts``: the engine's host name -> Host (an added host goes in, so ranks can start
        there); ``machines``: the machine ids that already hold the workspace; ``live_hosts``: the
        ssh target of every live rank; ``probe(host, ports)`` -> ssh.Probed; ``dispatch(host)``
        copies the workspace there (None: the job dispatches none); ``record``: the launcher's event."""
        self.server_pool = list(server_hosts or hosts)
        self.trainer_pool = list(trainer_hosts or hosts)
        self.added: list[Host] = []
        self.engine_hosts = engine_hosts
        self.machines = set(machines)
        self.live_hosts, self.probe, self.dispatch, self.record = live_hosts, probe, dispatch, record
        self.server_host: dict[str, Host] = {}      # a new server's address -> the host it was asked of
        self.removed: list[Host] = []                # `scale --remove-host`: never placed on again

    def pick(self, role: str) -> Host:
        """The least loaded host a new ``role`` rank may go to."""
        pool = (self.server_pool if role == "server" else self.trainer_pool) + self.added
        used = collections.Counter(self.live_hosts())
        return place(1, pool, dict(used), f"a new {role}")[0]

    def named(self, name: str, role: str) -> Host:
        """The job's host ``name`` (its name or user@name) for a new ``role`` rank, if it has a free slot."""
        pool = (self.server_pool if role == "server" else self.trainer_pool) + self.added
        found = [h for h in pool if name in (h.host, h.target)]
        if not found:
            raise ConfigError(f"--on {name}: not one of the hosts this job may start a {role} on "
                              f"({', '.join(h.target for h in pool)}); add it first: --add-host {name}")
        used = collections.Counter(self.live_hosts())
        return place(1, found, dict(used), f"a new {role} on {name}")[0]

    def new_server_address(self, name: str | None = None) -> str:
        """host:port for a new server (Placement.new_server_address): on host ``name`` or else the
        least loaded host, a port that host says is free."""
        host = self.pick("server") if name is None else self.named(name, "server")
        address = f"{host.address}:{self.probe(host, 1).ports[0]}"
        self.server_host[address] = host
        return address

    def place_rank(self, rank: RankSpec) -> RankSpec:
        """``rank`` (about to start mid-job) on its host: a server where its address was asked, a
        trainer on the least loaded host; told its host's address (PARAMSHARD_HOST)."""
        if rank.env.server_id is not None and rank.name.startswith("server"):
            address = rank.env.servers[rank.env.server_id]
            asked = self.server_host.pop(address, None)         # by new_server_address
            if asked is None:                                     # a server restarted where it ran
                assert rank.host is not None, f"{rank.name}: every rank of an SSH job has its host"
                asked = self.engine_hosts[rank.host]
            host = asked
        else:
            host = self.pick("trainer")
        return dataclasses.replace(rank, host=host.host, env=dataclasses.replace(rank.env, host=host.address))

    def add_host(self, text: str) -> str:
        """Make ``text`` ([user@]host[:port] [slots=N]) one of the job's hosts; ConfigError naming
        what is wrong (a bad entry, a host of the job already, ssh or the remote Python failing)."""
        host = parse_host(text)
        if host.host in self.engine_hosts and not any(r.host == host.host for r in self.removed):
            raise ConfigError(f"--add-host {text}: {host.host} is one of this job's hosts already; new ranks "
                              f"go to the least loaded host by themselves")
        found = self.probe(host, 0)
        sent = None
        if self.dispatch is not None and found.machine not in self.machines:
            sent = self.dispatch(host)
        self.machines.add(found.machine)
        self.added.append(host)
        self.removed = [r for r in self.removed if r.host != host.host]     # a removed host may come back
        self.engine_hosts[host.host] = host
        copied = ("workspace copied" if sent is not None else
                  "workspace already there (same machine)" if self.dispatch is not None else "no workspace to copy")
        text = (f"host {host.target} added to the job ({found.cpus} CPUs, {copied}); new trainers and servers "
                f"go to the least loaded host")
        log.info("%s", text)
        self.record("host_added", text, host=host.target, cpus=found.cpus, files_sent=sent)
        return text

    def job_hosts(self) -> list[Host]:
        """The hosts new ranks may go to, each once: both pools and those added, in the job's order."""
        out: dict[str, Host] = {}
        for h in [*self.server_pool, *self.trainer_pool, *self.added]:
            out.setdefault(h.host, h)
        return list(out.values())

    def find(self, text: str) -> Host:
        """The job's host that ``text`` (host, user@host, [user@]host[:port]) names; ConfigError if none."""
        wanted = parse_host(text)
        for h in self.job_hosts():
            if h.host == wanted.host and wanted.user in (None, h.user) and wanted.port in (None, h.port):
                return h
        if any(h.host == wanted.host for h in self.removed):
            raise ConfigError(f"--remove-host {text}: {wanted.host} was removed from this job already")
        raise ConfigError(f"--remove-host {text}: not one of this job's hosts "
                          f"({', '.join(h.target for h in self.job_hosts())})")

    def remove_host(self, host: Host) -> None:
        """No rank started from now on goes to ``host`` (scale --trainers/--servers, replacements, --on)."""
        self.server_pool = [h for h in self.server_pool if h.host != host.host]
        self.trainer_pool = [h for h in self.trainer_pool if h.host != host.host]
        self.added = [h for h in self.added if h.host != host.host]
        self.removed.append(host)
        log.info("host %s removed from the job's placement: no new rank goes there", host.target)
