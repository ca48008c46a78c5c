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
from typing import TYPE_CHECKING, Callable, Iterable, Sequence, TextIO

from paramshard.env import ClusterEnv
from paramshard.log import get_logger
from paramshard.launch.api import MALLOC_TUNABLES, JobSpec, LaunchConfig, RankSpec
from paramshard.errors import ConfigError
from paramshard.launch.engines.placement import TapFor
from paramshard.launch.engines.ports import free_ports
from paramshard.launch.engines.processes import Child, stop_all
from paramshard.launch.supervision.signals import LEAVE_SIGNAL, StopSignal, signal_number, stop_signals

__all__ = ["LaunchConfig", "LocalEngine", "LocalLauncher", "LocalPlacement", "StopSignal", "child_environ",
           "signal_number", "stop_signals", "MALLOC_TUNABLES"]

log = get_logger("launch")


class LocalEngine:
    """Ranks as child processes of this one (Engine contract, launch/engines/process.py); with
    ``fork``, forked from a pre-imported interpreter where they can be (launch/engines/fork_server.py)."""

    def __init__(self, out=None, fork: bool = False, tap_for: TapFor | None = None):
        self.out = out or sys.stdout
        self.fork = fork
        self.tap_for = tap_for       # rank -> Child tap (observe/run_records/run_dir.py): `paramshard launch`'s

    def start(self, rank: RankSpec) -> Child:
        environ = child_environ(rank.env, rank.extra_environ)
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


def child_environ(env: ClusterEnv, extra: Iterable[tuple[str, str]] = ()) -> dict:
    """A rank's whole environment on this machine: this process's, less the variables of another
    job (PARAMSHARD_*, PaddlePaddle's, Open MPI's rank), plus its contract and ``extra``."""
    environ = rank_base_environ()
    environ.update(env.to_environ())
    environ.update(extra)
    environ["PYTHONUNBUFFERED"] = "1"
    environ.setdefault("GLIBC_TUNABLES", MALLOC_TUNABLES)
    return environ


def rank_base_environ() -> dict[str, str]:
    """What every local rank's environment starts from: this process's, less another job's
    variables (the shared fork server's starter builds its environment from it too)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PARAMSHARD_", "PADDLE_", "OMPI_COMM_WORLD"))}


class LocalPlacement:
    """Every rank on this machine, each server on a free port of ``config.host`` (Placement contract,
    launch/engines/placement.py)."""
    on_hosts = False

    def __init__(self, config: LaunchConfig):
        self.config = config

    def engine(self, out: TextIO | None, tap_for: TapFor | None) -> LocalEngine:
        return LocalEngine(out, fork=self.config.fork, tap_for=tap_for)

    def job_spec(self, running: Callable[[], list[RankSpec]], record: Callable[..., None]) -> JobSpec:
        c = self.config
        ports = free_ports(c.servers + c.collective, c.host)
        addresses = [f"{c.host}:{p}" for p in ports[:c.servers]]
        # Collective and hybrid modes: trainer 0 hosts the trainers' store on the last port.
        collective_addr = f"{c.host}:{ports[-1]}" if c.collective else None
        return JobSpec.build(c, addresses, python=sys.executable, collective_addr=collective_addr)

    def describe(self, spec: JobSpec) -> str:
        c = self.config
        addresses = spec.servers[0].env.servers if spec.servers else ()
        collective_addr = spec.trainers[0].env.collective_addr
        return (f"started {c.servers} servers ({','.join(addresses) or '-'}) and {c.trainers} trainers"
                + (f" ({c.mode} mode, trainer 0 hosts their store at {collective_addr})" if c.collective else "")
                + f", OMP_NUM_THREADS={dict(spec.trainers[0].extra_environ).get('OMP_NUM_THREADS')} each")

    def new_server_address(self, host: str | None = None) -> str:
        if host is not None:        # the control channel offers --on to jobs on hosts only
            raise ConfigError(f"--on {host}: this job's ranks all run on this machine")
        return f"{self.config.host}:{free_ports(1, self.config.host)[0]}"

    def place_rank(self, rank: RankSpec) -> RankSpec:
        return rank

    def add_host(self, text: str) -> str:
        raise ConfigError(f"--add-host {text}: this job was not launched over SSH (paramshard launch --hosts ...); "
                          f"its ranks all run on this machine")

    def find(self, text: str):
        raise ConfigError(f"--remove-host {text}: this job was not launched over SSH (paramshard launch --hosts "
                          f"...); its ranks all run on this machine")

    def remove_host(self, host) -> None:
        raise ConfigError(f"{host}: this job was not launched over SSH; its ranks all run on this machine")


def LocalLauncher(config: LaunchConfig, out=None):     # noqa: N802 - the name users and tests know
    """A Launcher for a job on this machine (launch/supervision/build.py: ``build_launcher``)."""
    from paramshard.launch.supervision.build import build_launcher
    return build_launcher(config, out=out)


if TYPE_CHECKING:   # `make typecheck` checks the contracts: Engine (process.py), Placement (placement.py)
    from paramshard.launch.engines.placement import Placement
    from paramshard.launch.engines.process import Engine
    _engine: type[Engine[Child]] = LocalEngine
    _placement: type[Placement] = LocalPlacement
