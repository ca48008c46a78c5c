"""The servers of a running job (``paramshard scale RUN_DIR --servers N``), for the Launcher.

A job launched with virtual partitions (``launch --partitions P``: PARAMSHARD_PARTITIONS) can
change how many servers hold its sparse tables while it trains:

- up: the launcher starts each new server process (a new index, its address from the engine:
  ``Launcher.new_server_address``; it knows every address so far; an SSH job places it on the
  host that address is on, ``Launcher.place_new_rank``: launch/ssh_placement.py), then
  launch/server_scaling.scale_servers moves it its share of the partitions in the background;
- down: scale_servers moves the partitions and dense blocks of the highest serving servers
  (server 0 stays: it holds the job's routing) to the others, the job's first servers
  included; a server left with nothing keeps running, serving nothing, until the job ends (a
  trainer that has not learnt the last routing yet still says ``leave`` to it).

The move runs on a thread, so the launcher's loop keeps watching the ranks; one move at a
time. Changes are told to ``Launcher.membership_listeners`` (role
server: added, removed) and the move itself is recorded by scale_servers (``scale_start``,
``scale_end``) through ``Launcher._event``.
"""
from __future__ import annotations

import dataclasses
import threading

from ..errors import ConfigError
from ..log import get_logger
from .api import RankSpec

log = get_logger("launch")


class ElasticServers:
    def __init__(self, launcher, scale=None):
        self.launcher = launcher
        first = launcher.spec.servers[0]
        self.env = first.env
        self.initial = len(launcher.spec.servers)
        self.addresses = list(first.env.servers)     # every server the job ever had, by index
        self.serving = list(range(self.initial))     # the indices that own partitions now
        self.move: threading.Thread | None = None
        self.last_error: str | None = None
        if scale is None:
            from .server_scaling import scale_servers as scale
        self._scale = scale

    def check(self, n: int) -> None:
        if not self.env.partitions:
            raise ConfigError(f"--servers {n}: this job routes ids by a fixed hash; launch it with --partitions P "
                              f"(virtual partitions, e.g. 1024) to add or remove servers while it runs")
        if self.move is not None and self.move.is_alive():
            raise ConfigError(f"--servers {n}: a move of partitions is under way; ask again when it ended "
                              f"(a scale_end event in the run directory)")
        if n < 1:
            raise ConfigError(f"--servers {n}: a job keeps at least one server (server 0, which holds its routing)")
        if n > self.env.partitions:
            raise ConfigError(f"--servers {n}: more servers than the job's {self.env.partitions} partitions")
        if n > len(self.serving) and getattr(self.launcher, "new_server_address", None) is None:
            raise ConfigError(f"--servers {n}: this engine cannot start a server mid-job yet (local and SSH jobs can)")

    def scale(self, n: int, host: str | None = None) -> str:
        """Run ``n`` servers; ``host``: where the new ones start (an engine that places servers on
        hosts: SSH), else where the engine's ``new_server_address`` puts them."""
        self.check(n)
        if host is not None and n <= len(self.serving):
            raise ConfigError(f"--servers {n} --on {host}: --on places new servers; this starts none")
        before = list(self.serving)
        if n == len(before):
            return f"already {n} servers"
        if n > len(before):
            added = [self._start_server(host) for _ in range(n - len(before))]
            target = before + added
        else:
            added, target = [], before[:n]
        removed = [s for s in before if s not in target]
        self.move = threading.Thread(target=self._run, args=(target, added, removed), name="server-move",
                                     daemon=True)
        self.move.start()
        what = (f"started servers {added}; moving their partitions to them" if added else
                f"moving the partitions of servers {removed} to the others")
        return f"{what} in the background ({len(before)} -> {n} servers; a scale_end event marks the end)"

    def _start_server(self, host: str | None = None) -> int:
        index = len(self.addresses)
        address = self.launcher.new_server_address() if host is None else self.launcher.new_server_address(host)
        self.addresses.append(address)
        model = self.launcher.spec.servers[0]
        rank = RankSpec(f"server {index}", dataclasses.replace(model.env, server_id=index,
                                                                servers=tuple(self.addresses)),
                        model.argv, model.host, model.extra_environ)
        place = getattr(self.launcher, "place_new_rank", None)     # SSH: on the host its address is on
        if place is not None:
            rank = place(rank)
        self.launcher.server_ranks.append(rank)
        self.launcher.servers.append(self.launcher.engine.start(rank))
        log.info("server %d starts at %s to join the running job", index, address)
        return index

    def _run(self, target: list[int], added: list[int], removed: list[int]) -> None:
        try:
            self._scale(self.env, self.addresses, target, event=self.launcher._event)
        except Exception as exc:       # noqa: BLE001 - reported, and the job goes on as it was
            self.last_error = f"moving partitions to servers {target} failed: {exc}"
            log.error("%s", self.last_error)
            self.launcher._event("scale_failed", self.last_error, servers=target)
            return
        self.serving = list(target)
        for s in added:
            self._tell("added", f"server {s} ({self.addresses[s]}) holds its share of the partitions", s)
        for s in removed:
            self._tell("removed", f"server {s} gave its partitions away; it serves nothing until the job ends", s)

    def _tell(self, change: str, text: str, server: int) -> None:
        log.info("%s", text)
        for listener in self.launcher.membership_listeners:
            listener(change, text, server=server, live=len(self.serving), role="server")
