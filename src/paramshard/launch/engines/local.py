"""Run a whole job on this machine: S servers and T trainers on free loopback ports.

Every child gets the environment contract; the launcher prints their logs
tagged by role and rank, and as soon as one process fails it stops the rest
and reports which one failed. SIGINT, SIGTERM and SIGHUP stop the whole job
(exit status 128 + signal number); if the launcher is killed outright, its
children are killed with it (see processes.py).
"""
from __future__ import annotations

import os
import sys
import threading
from typing import TYPE_CHECKING, Iterable, Sequence

from paramshard.env import ClusterEnv
from paramshard.log import get_logger
from paramshard.launch.api import MALLOC_TUNABLES, JobSpec, LaunchConfig, RankSpec
from paramshard.launch.supervision.launcher import Launcher
from paramshard.launch.supervision.restart_policy import RestartPolicy
from paramshard.launch.engines.ports import free_ports
from paramshard.launch.engines.processes import Child, stop_all
from paramshard.launch.supervision.signals import LEAVE_SIGNAL, StopSignal, signal_number, stop_signals

__all__ = ["LaunchConfig", "LocalEngine", "LocalLauncher", "StopSignal", "signal_number", "stop_signals",
           "MALLOC_TUNABLES"]

log = get_logger("launch")


class LocalEngine:
    """Ranks as child processes of this one (Engine contract, launch/engines/process.py); with
    ``fork``, forked from a pre-imported interpreter where they can be (launch/engines/fork_server.py)."""

    def __init__(self, out=None, fork: bool = False):
        self.out = out or sys.stdout
        self.fork = fork
        self.tap_for = None          # rank -> Child tap (observe/run_records/run_dir.py), set by `paramshard launch`

    def start(self, rank: RankSpec) -> Child:
        environ = LocalLauncher._child_environ(rank.env, rank.extra_environ)
        return Child(rank.tag, rank.argv, environ, self.out, tap=self.tap_for(rank) if self.tap_for else None,
                     spawn=self._forked(rank, environ) if self.fork else None)

    @staticmethod
    def _forked(rank: RankSpec, environ: dict):
        """How to fork this rank from the fork server, or None: it starts as a new process (logged)."""
        from paramshard.launch.engines import fork_server
        server = fork_server.shared(environ)
        why = server.reason_not_to_fork(rank.argv, environ)
        if why is not None:
            log.info("--fork: %s starts as a new process: %s", rank.tag, why)
            return None
        # A server imports what it needs later, as it does unforked: it need not wait for torch.
        return lambda: server.fork(rank.argv, environ, all_imports=rank.env.role != "server")

    def stop(self, processes: Sequence[Child], grace: float, hurry: threading.Event | None) -> None:
        stop_all(processes, grace, hurry)

    @staticmethod
    def ask_to_leave(process: Child) -> None:
        """An elastic job's trainer leaves at its next step boundary (trainer/leave_request.py)."""
        if process.poll() is None:
            os.kill(process.pid, LEAVE_SIGNAL)


class LocalLauncher(Launcher):
    def __init__(self, config: LaunchConfig, out=None):
        super().__init__(LocalEngine(out, fork=config.fork))
        self.config = config
        self.min_trainers = config.min_trainers
        self.checkpoint_dir = config.checkpoint_dir
        self.policy = RestartPolicy(config.max_restarts)
        self.out = self.engine.out
        self.addresses: list[str] = []
        self.new_server_address = lambda: f"{config.host}:{free_ports(1, config.host)[0]}"

    def start(self) -> "LocalLauncher":
        c = self.config
        ports = free_ports(c.servers + c.collective, c.host)
        self.addresses = [f"{c.host}:{p}" for p in ports[:c.servers]]
        # Collective and hybrid modes: trainer 0 hosts the trainers' store on the last port.
        collective_addr = f"{c.host}:{ports[-1]}" if c.collective else None
        spec = JobSpec.build(c, self.addresses, python=sys.executable, collective_addr=collective_addr)
        self.start_job(spec)
        log.info("started %d servers (%s) and %d trainers%s, OMP_NUM_THREADS=%s each", c.servers,
                 ",".join(self.addresses) or "-", c.trainers,
                 f" ({c.mode} mode, trainer 0 hosts their store at {collective_addr})" if c.collective else "",
                 dict(spec.trainers[0].extra_environ).get("OMP_NUM_THREADS"))
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Block until every server answers; raise naming the ones that do not."""
        from paramshard.client.control import wait_for_servers
        wait_for_servers(self.config.base_env(self.addresses), who="launcher", timeout=timeout)

    @staticmethod
    def _child_environ(env: ClusterEnv, extra: Iterable[tuple[str, str]] = ()) -> dict:
        environ = {k: v for k, v in os.environ.items()
                   if not k.startswith(("PARAMSHARD_", "PADDLE_", "OMPI_COMM_WORLD"))}
        environ.update(env.to_environ())
        environ.update(extra)
        environ["PYTHONUNBUFFERED"] = "1"
        environ.setdefault("GLIBC_TUNABLES", MALLOC_TUNABLES)
        return environ


if TYPE_CHECKING:   # `make typecheck` checks the contract: Engine (launch/engines/process.py)
    from paramshard.launch.engines.process import Engine
    _engine: type[Engine[Child]] = LocalEngine
