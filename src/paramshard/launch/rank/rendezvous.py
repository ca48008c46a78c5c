"""Every rank tells every other rank where it is, through what its engine offers.

- OpenMPI: an allgather over MPI (mpi4py). Records travel as JSON bytes through
  the buffer interface (``Allgatherv``), never as pickles.
- torchrun: the c10d TCPStore the torchrun agent already runs at
  MASTER_ADDR:MASTER_PORT, under a prefix per run id and restart count.
- Slurm: a TCPStore that the first task on the first node of the allocation
  hosts, at that node's address as Slurm knows it (``NodeAddr``), on a port
  from ``--store-port`` / PARAMSHARD_STORE_PORT (default: derived from the job id,
  so two jobs sharing a node do not collide).

Each rank contributes one record: its host as the engine names it, and, for a
server, the ``host:port`` it listens on. Every wait has the job's deadline.

The stores are plain TCP without authentication: a process that squats the port
or writes under the prefix can publish fake server addresses. They never carry
the job's secret (launch/rank/job_secret.py); a fake server cannot complete the
CurveZMQ handshake with the job's keys, and the trainer's error says so.
"""
from __future__ import annotations

import datetime
import ipaddress
import json
import socket
import subprocess
import time
from typing import Mapping, Protocol

from paramshard.errors import ConfigError, ParamshardError
from paramshard.settings.process_variables import STORE_PORT
from paramshard.settings.table import by_field
from paramshard.launch.rank.world import World

STORE_PORT_BASE = 29600      # Slurm store: base + job id % STORE_PORT_SPAN unless set
STORE_PORT_SPAN = 2000


class RendezvousError(ParamshardError):
    """The ranks could not find each other in time."""


def route_source(host: str) -> str:
    """This machine's address on the route towards ``host``: the address ``host``
    reaches us at. A UDP connect picks the route and sends nothing."""
    try:
        addr = socket.getaddrinfo(host, 9, socket.AF_INET, socket.SOCK_DGRAM)[0][4][0]
    except socket.gaierror as exc:
        raise ConfigError(f"cannot resolve {host!r} (the engine's rendezvous host): {exc}") from None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((addr, 9))
        return s.getsockname()[0]


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def own_address(world: World, environ: Mapping[str, str]) -> str:
    """The address other hosts reach this rank's host at (a server advertises it).

    PARAMSHARD_HOST wins. Otherwise the route towards the engine's rendezvous host:
    a machine has many addresses, the one facing the other ranks is the one that
    counts (never the hostname's: it often resolves to 127.0.1.1). A loopback route
    means every rank shares this machine; if an ssh login to a loopback alias started
    this rank (SSH_CONNECTION), that alias says which simulated host this is."""
    explicit = by_field("host").read(environ)
    if explicit:
        return explicit
    routed = route_source(world.rendezvous_host) if world.rendezvous_host else "127.0.0.1"
    if _is_loopback(routed):
        ssh = environ.get("SSH_CONNECTION", "").split()
        if len(ssh) == 4 and _is_loopback(ssh[2]):
            return ssh[2]
    return routed


class Exchange(Protocol):
    # Only the job's own ranks can read or write what goes through it (MPI): it may carry
    # the job's secret. A TCP store is open to any process that reaches its port.
    trusted: bool

    def allgather(self, record: dict) -> list[dict]:
        """Every rank's record, in rank order."""

    def close(self) -> None:
        """Done: release the engine's resources (MPI is finalized, a hosted store closes
        once every rank has read)."""


class MpiExchange:
    trusted = True     # MPI's own transport between the ranks mpirun started

    def __init__(self, world: World):
        try:
            from mpi4py import MPI
        except ImportError:
            raise ConfigError("paramshard run under mpirun needs mpi4py: pip install 'paramshard[mpi]' "
                              "(and an MPI library, e.g. Debian's openmpi-bin)") from None
        self._mpi = MPI
        self.comm = MPI.COMM_WORLD
        if (self.comm.Get_rank(), self.comm.Get_size()) != (world.rank, world.size):
            raise ConfigError(f"MPI says rank {self.comm.Get_rank()} of {self.comm.Get_size()}, the "
                              f"environment says {world.rank} of {world.size}: was mpi4py built for "
                              f"another MPI library than this mpirun?")

    def allgather(self, record: dict) -> list[dict]:
        import numpy as np
        mine = json.dumps(record).encode()
        lengths = np.zeros(self.comm.Get_size(), np.int64)
        self.comm.Allgather(np.array([len(mine)], np.int64), lengths)
        buf = np.empty(int(lengths.sum()), np.uint8)
        self.comm.Allgatherv(np.frombuffer(mine, np.uint8), (buf, lengths))
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        return [json.loads(buf[offsets[i]:offsets[i + 1]].tobytes()) for i in range(len(lengths))]

    def close(self) -> None:
        # Before a trainer execs its script: a rank that ends without MPI_Finalize
        # makes mpirun report the job as failed.
        if not self._mpi.Is_finalized():
            self._mpi.Finalize()


class StoreExchange:
    """Records under ``<prefix>/rank/<r>`` in a torch TCPStore (a client, or the host of it)."""
    trusted = False    # unauthenticated: any local process can read and write it

    def __init__(self, world: World, host: str, port: int, timeout: float, hosting: bool = False,
                 bind: str | None = None):
        from torch.distributed import PrefixStore, TCPStore
        self.world = world
        self.timeout = timeout
        delta = datetime.timedelta(seconds=timeout)
        what = f"{world.engine} store at {host}:{port}"
        try:
            if hosting:
                # Listen on one address, not on every interface as TCPStore would by itself.
                listener = socket.create_server((bind or host, port), backlog=1024)
                try:
                    base = TCPStore(host, port, None, True, timeout=delta, wait_for_workers=False,
                                    master_listen_fd=listener.fileno())
                except BaseException:
                    listener.close()
                    raise
                listener.detach()     # the store owns the descriptor now and closes it itself
            else:
                base = _connect_with_retry(TCPStore, host, port, delta, timeout)
        except OSError as exc:
            raise RendezvousError(f"{world.describe()}: cannot {'host' if hosting else 'reach'} the {what}: "
                                  f"{exc}") from None
        self._base = base
        self.hosting = hosting
        self.store = PrefixStore(f"paramshard/{world.job_key}", base)
        self.what = what

    def allgather(self, record: dict) -> list[dict]:
        keys = [f"rank/{r}" for r in range(self.world.size)]
        self.store.set(keys[self.world.rank], json.dumps(record))
        try:
            self.store.wait(keys, datetime.timedelta(seconds=self.timeout))
        except Exception as exc:   # torch raises DistStoreError (a RuntimeError) on timeout
            missing = [r for r, k in enumerate(keys) if not self.store.check([k])]
            raise RendezvousError(f"{self.world.describe()}: ranks {missing} did not report to the {self.what} "
                                  f"within {self.timeout:g} s (did they start? same --servers everywhere?)"
                                  ) from exc
        records = [json.loads(self.store.get(k)) for k in keys]
        self.store.add("read", 1)
        return records

    def close(self) -> None:
        if self.hosting:
            # The store lives in this process: keep it until every rank has read.
            deadline = time.monotonic() + self.timeout
            while self.store.add("read", 0) < self.world.size:
                if time.monotonic() > deadline:
                    raise RendezvousError(f"{self.world.describe()}: not every rank read the server "
                                          f"addresses within {self.timeout:g} s")
                time.sleep(0.02)
        del self.store, self._base


def _connect_with_retry(tcp_store, host: str, port: int, delta, timeout: float):
    """The hosting rank may start a moment after the others: retry until the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return tcp_store(host, port, None, False, timeout=delta)
        except (RuntimeError, OSError):
            if time.monotonic() > deadline:
                raise OSError(f"nothing answered within {timeout:g} s") from None
            time.sleep(0.2)


def slurm_first_node_address(environ: Mapping[str, str]) -> str:
    """The address Slurm reaches the allocation's first node at (its NodeAddr)."""
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST", "")
    if not nodelist:
        raise ConfigError("under Slurm, paramshard run needs SLURM_JOB_NODELIST (run it with srun)")
    first = _scontrol(["show", "hostnames", nodelist]).split()[0]
    for field in _scontrol(["show", "node", "-o", first]).split():
        if field.startswith("NodeAddr="):
            return field.partition("=")[2]
    return first


def _scontrol(args: list[str]) -> str:
    try:
        out = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise ConfigError("scontrol not found: Slurm's commands must be on PATH on every node") from None
    except subprocess.TimeoutExpired:
        raise RendezvousError(f"scontrol {' '.join(args)} did not answer within 30 s") from None
    if out.returncode != 0:
        raise RendezvousError(f"scontrol {' '.join(args)} failed: {out.stderr.strip()}")
    return out.stdout


def slurm_store_port(environ: Mapping[str, str], flag: int | None) -> int:
    if flag is not None:
        return flag
    given = STORE_PORT.read(environ)
    if given is not None:
        return given
    job = environ.get("SLURM_JOB_ID", "0")
    return STORE_PORT_BASE + (int(job) if job.isdigit() else 0) % STORE_PORT_SPAN


def exchange_for(world: World, environ: Mapping[str, str], timeout: float,
                 store_port: int | None = None) -> tuple[Exchange, World]:
    """The engine's way to gather records, and the world completed with where its
    rendezvous host is (Slurm learns it only here)."""
    if world.engine == "openmpi":
        return MpiExchange(world), world
    if world.engine == "torchrun":
        return StoreExchange(world, environ["MASTER_ADDR"], int(environ["MASTER_PORT"]), timeout), world
    if world.engine == "slurm":
        host = slurm_first_node_address(environ)
        world = World(world.engine, world.rank, world.size, world.node, world.job_key, rendezvous_host=host)
        hosting = environ.get("SLURM_NODEID") == "0" and environ.get("SLURM_LOCALID") == "0"
        return StoreExchange(world, host, slurm_store_port(environ, store_port), timeout, hosting=hosting), world
    raise ConfigError(f"no address exchange for engine {world.engine!r}")

