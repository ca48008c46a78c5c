"""Run a whole job on this machine: S servers and T trainers on free loopback ports.

Every child gets the environment contract; the launcher prints their logs
tagged by role and rank, and as soon as one process fails it stops the rest
and reports which one failed.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Sequence

from ..env import ClusterEnv
from ..errors import ConfigError
from ..log import get_logger
from .ports import free_ports
from .processes import Child

log = get_logger("launch")

# libzmq mallocs every received message. With glibc's defaults a big message
# gets fresh pages (mmap, or a heap that was just trimmed), so page faults
# dominate large transfers. Keep everything up to 32 MiB on a heap that is
# never trimmed, and back larger blocks with transparent huge pages. Measured
# (benchmarks/RESULTS.md): 16 MiB push+pull 0.55x -> 0.76x of raw pyzmq under
# the same settings; 64 MiB round trip 152 -> 87 ms.
MALLOC_TUNABLES = ("glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=33554432:"
                   "glibc.malloc.trim_threshold=2147483648")


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    script: str
    script_args: tuple[str, ...] = ()
    servers: int = 1
    trainers: int = 1
    mode: str = "sync"
    dispatch: str = "round_robin"
    min_block_size: int = 8192
    timeout: float = 120.0
    host: str = "127.0.0.1"
    secret: str | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self):
        if self.servers < 1:
            raise ConfigError(f"--servers {self.servers}: a job needs at least one server")
        if self.trainers < 1:
            raise ConfigError(f"--trainers {self.trainers}: a job needs at least one trainer")
        if not os.path.isfile(self.script):
            raise ConfigError(f"training script {self.script!r} not found")
        # Building the contract validates mode, dispatch, block size, timeout.
        self.base_env(["127.0.0.1:1"] * self.servers)

    def base_env(self, servers: Sequence[str]) -> ClusterEnv:
        return ClusterEnv(role=None, servers=tuple(servers), num_trainers=self.trainers, mode=self.mode,
                          dispatch=self.dispatch, min_block_size=self.min_block_size, timeout=self.timeout,
                          secret=self.secret)


class LocalLauncher:
    def __init__(self, config: LaunchConfig, out=None):
        self.config = config
        self.out = out or sys.stdout
        self.servers: list[Child] = []
        self.trainers: list[Child] = []
        self.addresses: list[str] = []

    def start(self) -> "LocalLauncher":
        c = self.config
        self.addresses = [f"{c.host}:{p}" for p in free_ports(c.servers, c.host)]
        base = c.base_env(self.addresses)
        for i in range(c.servers):
            env = dataclasses.replace(base, role="server", server_id=i)
            self.servers.append(Child(f"server {i}", [sys.executable, "-m", "paramshard", "server"],
                                      self._child_environ(env), self.out))
        for i in range(c.trainers):
            env = dataclasses.replace(base, role="trainer", trainer_id=i)
            self.trainers.append(Child(f"trainer {i}", [sys.executable, c.script, *c.script_args],
                                       self._child_environ(env), self.out))
        log.info("started %d servers (%s) and %d trainers", c.servers, ",".join(self.addresses), c.trainers)
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Block until every server answers; raise naming the ones that do not."""
        from ..transport.client import ServerLinks
        with ServerLinks(self.addresses, timeout, who="launcher", secret=self.config.secret) as links:
            links.wait_ready(timeout)

    def __enter__(self) -> "LocalLauncher":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    @staticmethod
    def _child_environ(env: ClusterEnv) -> dict:
        environ = {k: v for k, v in os.environ.items()
                   if not k.startswith(("PARAMSHARD_", "PADDLE_", "OMPI_COMM_WORLD"))}
        environ.update(env.to_environ())
        environ["PYTHONUNBUFFERED"] = "1"
        environ.setdefault("GLIBC_TUNABLES", MALLOC_TUNABLES)
        return environ

    def wait(self, poll_interval: float = 0.1) -> int:
        """Block until the job ends; 0 when every trainer succeeded."""
        try:
            while True:
                failed = [c for c in self.servers + self.trainers if c.poll() not in (None, 0)]
                if failed:
                    log.error("%s; stopping the job", failed[0].describe_exit())
                    self.close()
                    return 1
                if all(t.poll() == 0 for t in self.trainers):
                    # Servers exit on their own once every trainer has left.
                    deadline = time.monotonic() + 10
                    while any(s.poll() is None for s in self.servers) and time.monotonic() < deadline:
                        time.sleep(poll_interval)
                    self.close()
                    log.info("job finished: %d trainers succeeded", len(self.trainers))
                    return 0
                time.sleep(poll_interval)
        except KeyboardInterrupt:
            log.warning("interrupted: stopping every process of the job")
            self.close()
            return 130

    def close(self) -> None:
        # Trainers first, so servers do not log lost clients needlessly.
        for child in self.trainers + self.servers:
            child.stop()
