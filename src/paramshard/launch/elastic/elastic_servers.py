"""The servers of a running job (``paramshard scale RUN_DIR --servers N``), for the Launcher.

A job launched with virtual partitions (``launch --partitions P``: PARAMSHARD_PARTITIONS) can
change how many servers hold its sparse tables while it trains:

- up: the launcher starts each new server process (a new index, its address from the job's
  placement: ``JobControl.new_server_address``; it knows every address so far; an SSH job places it
  on the host that address is on: launch/engines/ssh_placement.py), then
  launch/server_scaling.scale_servers moves it its share of the partitions in the background;
- down: scale_servers moves the partitions and dense blocks of the highest serving servers
  (server 0 stays: it holds the job's routing) to the others, the job's first servers
  included. The routing then names a removed server retired (""); once every trainer's
  requests carry a routing version under which it owns nothing (server 0 says which each one
  carried, ``routing_get``), no trainer will send it data again, and trainers fetch the routing
  before they ``leave`` or ask every server, so it is told to exit (``retire`` with ``exit``: ``stop_when_unneeded``). Its index is never used again;
  the moves that follow are given "" for it, so nothing connects to it;
- remove (``scale --remove-host HOST``: launch/elastic/host_removal.py): the same move and retirement for
  exactly the servers named (those on the host), whatever their index.

The move runs on a thread, so the launcher's loop keeps watching the ranks; one move at a
time. The job is seen through its ``JobControl`` (launch/elastic/job_control.py, implemented by
the Launcher). Changes are told through ``JobControl.tell_membership`` (role server: added,
removed) and the move itself is recorded by scale_servers (``scale_start``, ``scale_end``)
through ``JobControl.record``.
"""
from __future__ import annotations

import dataclasses
import threading

import time

from paramshard.errors import ConfigError
from paramshard.log import get_logger
from paramshard.placement.partitions import Routing
from paramshard.launch.api import RankSpec
from paramshard.launch.elastic.job_control import JobControl

log = get_logger("launch")

# How long a removed server waits for every trainer to route by a routing that names it retired,
# in PARAMSHARD_TIMEOUTs (each training trainer sends server 0 a request a step; one evaluating or
# in a long barrier sends none meanwhile). Past it the server keeps running, idle, to the job's end.
RETIRE_PATIENCE_TIMEOUTS = 5
RETIRE_POLL = 0.5


def stop_when_unneeded(env, addresses, removed: list[int], version: int | None, clock=time.monotonic,
                       sleep=time.sleep, patience: float | None = None) -> bool:
    """Tell ``removed`` servers to exit once every trainer of the job routes by routing ``version``
    (None: server 0's now) or later, which names them retired; False (they keep running) when some
    trainer has not within ``patience`` seconds (RETIRE_PATIENCE_TIMEOUTS x the job's timeout)."""
    from paramshard.transport.links import ServerLinks
    from paramshard.transport.security import Security
    wanted = [a if i == 0 or i in removed else "" for i, a in enumerate(addresses)]
    patience = RETIRE_PATIENCE_TIMEOUTS * env.timeout if patience is None else patience
    with ServerLinks(wanted, env.timeout, who="launcher (retiring servers)", security=Security.from_env(env)) as links:
        deadline = clock() + patience
        while True:
            header, _ = links.request(0, {"op": "routing_get"})
            routing = Routing.from_wire(header["routing"])
            if version is None:
                version = routing.version
            named = [s for s in removed if s < len(routing.addresses) and routing.addresses[s]]
            if named:
                raise ConfigError(f"servers {named} are not retired in server 0's routing (version "
                                  f"{routing.version}): they are not stopped")
            behind = sorted(t for t, seen in header.get("trainers", []) if seen < version)
            if not behind:
                break
            if clock() >= deadline:
                log.warning("servers %s keep running, idle, until the job ends: trainers %s have sent no request "
                            "under routing version %d (which removed them) within %g s", removed, behind, version,
                            patience)
                return False
            sleep(RETIRE_POLL)
        for s in removed:
            links.request(s, {"op": "retire", "exit": True})
    return True


class ElasticServers:
    def __init__(self, job: JobControl, scale=None, retire=None):
        self.job = job
        first = job.spec.servers[0]
        self.env = first.env
        self.initial = len(job.spec.servers)
        self.addresses = list(first.env.servers)     # every server the job ever had, by index
        self.serving = list(range(self.initial))     # the indices that own partitions now
        self.retired: set[int] = set()               # removed by a scale: "" in the routing, never reused
        self.retiring: threading.Thread | None = None
        self.move: threading.Thread | None = None
        self.last_error: str | None = None
        # The job's end cut the move short: said once, by whoever sees it first (the move's own failure,
        # or observe/live/job_watch.py as the job ends: Launcher.unfinished_move).
        self.end_told = False
        self._end_lock = threading.Lock()
        if scale is None:
            from paramshard.launch.elastic.server_scaling import scale_servers as scale
        self._scale = scale
        self._retire = stop_when_unneeded if retire is None else retire

    def check(self, n: int) -> None:
        if not self.env.partitions:
            raise ConfigError(f"--servers {n}: this job routes ids by a fixed hash; launch it with --partitions P "
                              f"(virtual partitions, e.g. 1024) to add or remove servers while it runs")
        if self.moving():
            raise ConfigError(f"--servers {n}: a move of partitions is under way; ask again when it ended "
                              f"(a scale_end event in the run directory)")
        if n < 1:
            raise ConfigError(f"--servers {n}: a job keeps at least one server (server 0, which holds its routing)")
        if n > self.env.partitions:
            raise ConfigError(f"--servers {n}: more servers than the job's {self.env.partitions} partitions")
        if n > len(self.serving) and not self.job.starts_servers:
            raise ConfigError(f"--servers {n}: this engine cannot start a server mid-job yet (local and SSH jobs can)")

    def scale(self, n: int, host: str | None = None) -> str:
        """Run ``n`` servers; ``host``: where the new ones start (an engine that places servers on
        hosts: SSH), else where the job's placement puts them (``JobControl.new_server_address``)."""
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
        self._begin(target, added, removed)
        what = (f"started servers {added}; moving their partitions to them" if added else
                f"moving the partitions of servers {removed} to the others")
        return f"{what} in the background ({len(before)} -> {n} servers; a scale_end event marks the end)"

    def moving(self) -> bool:
        return self.move is not None and self.move.is_alive()

    def cut_by_job_end(self, text: str) -> str | None:
        """The job ended while a move ran: ``text`` (kept as ``last_error``) for the first caller to
        say it, None for the others (the move's thread and the job's end race to it)."""
        with self._end_lock:
            if self.end_told:
                return None
            self.end_told, self.last_error = True, text
            return text

    def remove(self, servers: list[int]) -> list[int]:
        """Move the partitions and dense blocks of exactly ``servers`` (serving ones, not server 0)
        to the other serving servers, in the background; they then retire and exit as the highest
        ones a scale down removes do. Returns the servers that keep serving. The caller checked
        the request (launch/elastic/host_removal.py); these checks guard the move itself."""
        if not self.env.partitions:
            raise ConfigError(f"servers {servers}: this job routes ids by a fixed hash; they cannot give their "
                              f"ids away (launch it with --partitions P)")
        if self.moving():
            raise ConfigError(f"a move of partitions is under way; ask again when it ended (a scale_end event in "
                              f"the run directory)")
        if 0 in servers or not set(servers) <= set(self.serving):
            raise ConfigError(f"servers {servers}: only serving servers other than server 0 can be removed "
                              f"(serving: {self.serving})")
        target = [s for s in self.serving if s not in servers]
        self._begin(target, [], sorted(servers))
        return target

    def _begin(self, target: list[int], added: list[int], removed: list[int]) -> None:
        self.move = threading.Thread(target=self._run, args=(target, added, removed), name="server-move",
                                     daemon=True)
        self.move.start()

    def _start_server(self, host: str | None = None) -> int:
        index = len(self.addresses)
        address = self.job.new_server_address() if host is None else self.job.new_server_address(host)
        self.addresses.append(address)
        model = self.job.spec.servers[0]
        rank = RankSpec(f"server {index}", dataclasses.replace(model.env, server_id=index,
                                                                servers=tuple(self.addresses)),
                        model.argv, model.host, model.extra_environ)
        self.job.start_server(rank)          # placed by the job (SSH: on the host its address is on)
        log.info("server %d starts at %s to join the running job", index, address)
        return index

    def live_addresses(self) -> list[str]:
        """Every server the job had, by index, "" for those a scale removed (as the routing names them)."""
        return [a if i not in self.retired else "" for i, a in enumerate(self.addresses)]

    def _run(self, target: list[int], added: list[int], removed: list[int]) -> None:
        try:
            record = self._scale(self.env, self.live_addresses(), target, event=self.job.record)
        except Exception as exc:       # noqa: BLE001 - reported, and the job goes on as it was
            if self.job.job_ended():
                # Its servers stopped with the job: nothing failed that a restart would mend.
                text = self.cut_by_job_end(f"the job ended during the move of partitions to servers {target}: "
                                           f"the move stopped unfinished (nothing to restart)")
                if text is not None:       # else said already, as the job ended (observe/live/job_watch.py)
                    log.info("%s", text)
                    self.job.record("scale_failed", text, servers=target, job_ended=True)
                return
            self.last_error = f"moving partitions to servers {target} failed: {exc}"
            log.error("%s", self.last_error)
            self.job.record("scale_failed", self.last_error, servers=target)
            return
        self.serving = list(target)
        self.retired.update(removed)
        if record is not None and record.unfinished:
            log.info("the move is done; removed servers did not answer its tidying (they may have stopped by "
                     "themselves, owning nothing): %s", "; ".join(record.unfinished))
        for s in added:
            self._tell("added", f"server {s} ({self.addresses[s]}) holds its share of the partitions", s)
        for s in removed:
            self._tell("removed", f"server {s} gave its partitions away; it exits once every trainer routes "
                                  f"without it", s)
        if removed:
            # The last hand-off's routing, one before the move's final one: under it the removed servers
            # own no partition and no block, so a trainer that routes by it sends them no data. The final
            # routing only names them retired (""); trainers learn it when they next ask server 0 (a
            # refusal, and before they leave or read every server's stats: trainer/backends/servers.py).
            final = record.routing_version if record is not None else None
            version = final - 1 if final else None
            addresses = list(self.addresses)
            self.retiring = threading.Thread(target=self._stop_removed, args=(addresses, removed, version),
                                             name="server-retire", daemon=True)
            self.retiring.start()

    def _stop_removed(self, addresses: list[str], removed: list[int], version: int | None) -> None:
        running = [s for s in removed if self.job.servers[s].poll() is None]
        if not running:
            log.info("servers %s exit: they stopped by themselves once no trainer was connected to them", removed)
            return
        removed = running
        try:
            if self._retire(self.env, addresses, removed, version):
                log.info("servers %s exit: no trainer routes to them any more", removed)
        except Exception as exc:     # noqa: BLE001 - the job goes on; they stay, idle, as before
            # A removed server also stops by itself once no trainer is connected to it: trainers drop
            # their links to a retired server, and one that left counts as gone (seen when a removed
            # host's trainers leave as its servers retire). The retire request then finds it gone.
            if self._exited(removed):
                log.info("servers %s exit: they stopped by themselves once no trainer was connected to them",
                         removed)
            else:
                log.warning("servers %s keep running, idle, until the job ends: %s", removed, exc)

    def _exited(self, servers: list[int], patience: float = 10.0, clock=time.monotonic) -> bool:
        """Whether the processes of ``servers`` all ended, given ``patience`` seconds to (an SSH
        rank's end reaches the launcher when its ssh session closes)."""
        deadline = clock() + patience
        while True:
            ended = [self.job.servers[s].poll() is not None for s in servers]
            if all(ended) or clock() >= deadline:
                return all(ended)
            time.sleep(0.1)

    def _tell(self, change: str, text: str, server: int) -> None:
        log.info("%s", text)
        self.job.tell_membership(change, text, server=server, live=len(self.serving), role="server")
