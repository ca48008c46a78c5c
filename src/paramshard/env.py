"""The environment contract (DESIGN section 5): every variable, in one place.

Processes read it once, at entry, into a frozen ``ClusterEnv``. The launcher
writes it with ``ClusterEnv.to_environ``; SSH, OpenMPI or Kubernetes set the
same variables, so one script runs under any engine.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Mapping

from .errors import ConfigError
from .limits import SPEC as LIMIT_SPEC, Limits
from .mode import MODES, PS_MODES, Mode

ROLES = ("server", "trainer")
COLLECTIVE_BACKENDS = ("gloo", "nccl")
DISPATCHERS = ("round_robin", "hash", "legacy_v1", "balanced")
DEFAULT_MIN_BLOCK_SIZE = 8192
DEFAULT_TIMEOUT = 120.0

# (name, meaning, fallbacks read when the name is unset). The README table is
# generated from this list by `paramshard env`.
VARIABLES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("PARAMSHARD_ROLE", "`server` or `trainer`; unset means a standalone run "
     "(a local server is started in-process)", ("PADDLE_TRAINING_ROLE", "TRAINING_ROLE")),
    ("PARAMSHARD_SERVERS", "comma-separated `host:port` of all servers",
     ("PADDLE_PSERVERS_IP_PORT_LIST", "PADDLE_INIT_PSERVERS (+PADDLE_INIT_PORT)")),
    ("PARAMSHARD_SERVER_ID", "this server's index (servers only)",
     ("PADDLE_PSERVER_ID", "PADDLE_CURRENT_ENDPOINT (looked up in the server list)")),
    ("PARAMSHARD_TRAINERS", "number of trainers",
     ("PADDLE_TRAINERS_NUM", "PADDLE_INIT_NUM_GRADIENT_SERVERS")),
    ("PARAMSHARD_TRAINER_ID", "this trainer's index, 0..T-1",
     ("PADDLE_TRAINER_ID", "PADDLE_INIT_TRAINER_ID")),
    ("PARAMSHARD_MODE", "`sync` (barrier per step, default), `async`, `collective` (no servers: dense "
     "gradients averaged by allreduce, torch DistributedDataParallel) or `hybrid` (dense by allreduce, "
     "sparse tables on the servers, sync steps)", ()),
    ("PARAMSHARD_COLLECTIVE_ADDR", "collective and hybrid modes: `host:port` where trainer 0 hosts the "
     "torch.distributed store the trainers meet at (the launcher picks it)", ()),
    ("PARAMSHARD_COLLECTIVE_BACKEND", "collective and hybrid modes: torch.distributed backend, `gloo` "
     "(default; CPU tensors) or `nccl`", ()),
    ("PARAMSHARD_COLLECTIVE_FD", "set by `paramshard run` on trainer 0: a listening socket for that store, "
     "bound before the address exchange", ()),
    ("PARAMSHARD_DISPATCH", "block placement: " + ", ".join(DISPATCHERS)
     + " (default round_robin)", ()),
    ("PARAMSHARD_MIN_BLOCK_SIZE", f"smallest dense block in elements (default {DEFAULT_MIN_BLOCK_SIZE})", ()),
    ("PARAMSHARD_TIMEOUT", f"seconds any single wait may take (default {DEFAULT_TIMEOUT:g})", ()),
    ("PARAMSHARD_BIND", "address a server binds to (default: the host of its own entry "
     "in PARAMSHARD_SERVERS)", ()),
    ("PARAMSHARD_SECRET", "shared secret: every connection is encrypted and authenticated with CurveZMQ, "
     "keys derived from it and the job id. Unset, `paramshard launch` and `paramshard run` make a random one per "
     "job (README \"Security\"); the launcher passes it on", ()),
    ("PARAMSHARD_INSECURE", "`1`: no secret is made, connections are plain TCP (`launch --insecure`, "
     "`run --insecure`); refused together with PARAMSHARD_SECRET or PARAMSHARD_KEYS_DIR", ()),
    ("PARAMSHARD_SECRET_DIR", "`paramshard run` under srun or torchrun without PARAMSHARD_SECRET: the directory, "
     "shared by every rank's host and private to this user, where the first rank writes the job's secret for the "
     "others (default ~/.paramshard/secrets)", ()),
    ("PARAMSHARD_JOB_ID", "name of this job, the same on every process; mixed into the keys so "
     "two jobs with one secret never accept each other's traffic (the launcher makes one)", ()),
    ("PARAMSHARD_KEYS_DIR", "CurveZMQ key files instead of a secret (see the README's security section)", ()),
    ("PARAMSHARD_WHERE", "where this process runs, for its log lines (`paramshard run` sets e.g. "
     "`rank 3 on node7`)", ()),
    ("PARAMSHARD_HOST", "the address other hosts reach this host at; a server started by `paramshard run` "
     "advertises it (default: the address on the route towards the engine's rendezvous host), a trainer "
     "serves its /metrics there (`launch --hosts` and `paramshard run` set it)", ()),
    ("PARAMSHARD_STORE_PORT", "Slurm: port of the address store `paramshard run` hosts on the first node "
     "(default 29600 + job id % 2000)", ()),
    ("PARAMSHARD_K8S_DELETE", "Kubernetes: objects server 0 deletes when the job ends "
     "(`services/NAME,statefulsets/NAME`; set by `paramshard k8s`)", ()),
    ("PARAMSHARD_K8S_NAMESPACE", "Kubernetes: namespace of those objects (from the downward API)", ()),
    ("PARAMSHARD_K8S_API_URL", "Kubernetes: API server URL instead of the in-cluster one (tests)", ()),
    ("PARAMSHARD_CHECKPOINT_DIR", "where checkpoints go (`launch --checkpoint-dir`); trainers save there "
     "every PARAMSHARD_CHECKPOINT_EVERY steps and when they finish", ()),
    ("PARAMSHARD_CHECKPOINT_EVERY", "steps between checkpoints (0: only the final one)", ()),
    ("PARAMSHARD_CHECKPOINT_KEEP", "how many checkpoints to keep (default 3)", ()),
    ("PARAMSHARD_RESUME", "a checkpoint (a step-N directory, or a checkpoint directory for its latest) "
     "the job starts from (`launch --resume`)", ()),
    ("PARAMSHARD_MIN_TRAINERS", "async: servers end normally once every trainer has ended, if at least this "
     "many left normally (`launch --min-trainers`); the others may have died", ()),
    ("PARAMSHARD_MAX_IN_FLIGHT", "async: pushes a trainer may have on their way before it waits for the "
     "oldest reply (default 1; 0 waits for every push; sync mode always waits)", ()),
    ("PARAMSHARD_MAX_RESTARTS", "how many times the launcher may restart a dead server in place "
     "(`launch --max-restarts`); trainers then wait for it and roll back to the latest checkpoint", ()),
    ("PARAMSHARD_RECOVERING", "set by the launcher on a server it restarted: serve nothing until the chief "
     "restores the checkpoint", ()),
    ("PARAMSHARD_LOG_LEVEL", "log level of every paramshard process: DEBUG, INFO, WARNING or ERROR "
     "(default INFO)", ()),
    ("PARAMSHARD_METRICS_PORT", "base port of the Prometheus `/metrics` endpoints: server i listens on "
     "PORT+i, trainer j on PORT+servers+j (0 or unset: none)", ()),
    ("PARAMSHARD_MAX_STALENESS", "async mode: a trainer may start step j only when every trainer finished "
     "step j-K-1 (bounded staleness, SSP); unset: no bound", ()),
    ("PARAMSHARD_RECORDS", "`stdout`: trainers print progress records for the launcher's run directory "
     "(set by `paramshard launch`); `dir:PATH`: every rank writes its own into PATH (`paramshard run "
     "--run-dir`)", ()),
) + tuple((variable, f"{meaning} (default {default})", ()) for variable, default, meaning in LIMIT_SPEC.values()) + (
    ("OMPI_COMM_WORLD_RANK", "under OpenMPI: ranks 0..S-1 are servers, the rest trainers "
     "(with OMPI_COMM_WORLD_SIZE)", ()),
    ("OMP_NUM_THREADS", "threads of torch's intra-op pool in each process (read by torch at import); "
     "`paramshard launch` sets it and MKL_NUM_THREADS to the CPUs of the host (its affinity) divided by "
     "the job's processes there, at least 1, unless it is set already: then it passes that value on", ()),
)


# What `paramshard run` reads from each engine (launch/world.py, launch/rendezvous.py):
# (engine, variable, what paramshard takes from it).
ENGINE_VARIABLES: tuple[tuple[str, str, str], ...] = (
    ("openmpi", "OMPI_COMM_WORLD_RANK", "rank"),
    ("openmpi", "OMPI_COMM_WORLD_SIZE", "world size"),
    ("openmpi", "OMPI_MCA_orte_hnp_uri", "mpirun's address: a server's own address is the one "
                                        "that routes towards it"),
    ("openmpi", "(MPI_Allgather)", "server addresses and every rank's host, exchanged over MPI"),
    ("slurm", "SLURM_PROCID", "rank"),
    ("slurm", "SLURM_NTASKS", "world size"),
    ("slurm", "SLURM_JOB_NODELIST", "first node (expanded with `scontrol show hostnames`): hosts "
                                    "the address store"),
    ("slurm", "SLURM_JOB_ID, SLURM_STEP_ID", "job id (keys, store namespace)"),
    ("slurm", "SLURMD_NODENAME", "this rank's host, in messages"),
    ("torchrun", "RANK", "rank"),
    ("torchrun", "WORLD_SIZE", "world size"),
    ("torchrun", "MASTER_ADDR, MASTER_PORT", "torchrun's own c10d store: the address exchange"),
    ("torchrun", "TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT", "job id and store namespace "
                                                                     "(a restart is a new job)"),
    ("any", "SSH_CONNECTION", "when a rank was started over ssh: the address its host was "
                              "reached at, which a server advertises"),
)

@dataclasses.dataclass(frozen=True)
class ClusterEnv:
    role: str | None                 # None: standalone, no cluster around
    servers: tuple[str, ...] = ()
    server_id: int | None = None
    num_trainers: int = 1
    trainer_id: int = 0
    mode: Mode = Mode.SYNC              # a plain string is parsed (Mode.parse)
    dispatch: str = "round_robin"
    min_block_size: int = DEFAULT_MIN_BLOCK_SIZE
    timeout: float = DEFAULT_TIMEOUT
    bind: str | None = None
    secret: str | None = dataclasses.field(default=None, repr=False)
    job_id: str = ""
    keys_dir: str | None = None
    insecure: bool = False           # plain TCP chosen on purpose: no secret is made for the job
    host: str | None = None          # this host's address as the others reach it (PARAMSHARD_HOST)
    limits: Limits = Limits()
    where: str = ""                  # e.g. "rank 3 on node7": log lines only
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    checkpoint_keep: int = 3
    resume: str | None = None
    min_trainers: int | None = None
    max_restarts: int = 0
    recovering: bool = False
    max_in_flight: int | None = None    # None: 1 in async mode, 0 in sync
    metrics_port: int = 0               # 0: no /metrics endpoint
    max_staleness: int | None = None    # async: bounded staleness (SSP); None: no bound
    records: str | None = None          # "stdout": progress records for the launcher
    collective_addr: str | None = None  # collective/hybrid: trainer 0's store (host:port)
    collective_backend: str = "gloo"
    collective_fd: int | None = None    # `paramshard run`: trainer 0's listening socket for that store

    def __post_init__(self):
        if self.role is not None and self.role not in ROLES:
            raise ConfigError(f"PARAMSHARD_ROLE={self.role!r}: expected one of {ROLES}")
        object.__setattr__(self, "mode", Mode.parse(self.mode))
        if self.collective_backend not in COLLECTIVE_BACKENDS:
            raise ConfigError(f"PARAMSHARD_COLLECTIVE_BACKEND={self.collective_backend!r}: expected one of "
                              f"{COLLECTIVE_BACKENDS}")
        if self.collective_addr is not None:
            _check_address("PARAMSHARD_COLLECTIVE_ADDR", self.collective_addr)
        if self.insecure and (self.secret or self.keys_dir):
            raise ConfigError(f"PARAMSHARD_INSECURE=1 (--insecure) asks for plain TCP, but "
                              f"{'PARAMSHARD_SECRET' if self.secret else 'PARAMSHARD_KEYS_DIR'} is set too: "
                              f"unset one of them")
        if self.dispatch not in DISPATCHERS:
            raise ConfigError(f"PARAMSHARD_DISPATCH={self.dispatch!r}: expected one of {DISPATCHERS}")
        if self.min_block_size < 1:
            raise ConfigError(f"PARAMSHARD_MIN_BLOCK_SIZE={self.min_block_size}: must be >= 1")
        if self.timeout <= 0:
            raise ConfigError(f"PARAMSHARD_TIMEOUT={self.timeout}: must be > 0 seconds")
        if self.num_trainers < 1:
            raise ConfigError(f"PARAMSHARD_TRAINERS={self.num_trainers}: must be >= 1")
        if self.checkpoint_every < 0:
            raise ConfigError(f"PARAMSHARD_CHECKPOINT_EVERY={self.checkpoint_every}: must be >= 0 steps")
        if self.checkpoint_keep < 1:
            raise ConfigError(f"PARAMSHARD_CHECKPOINT_KEEP={self.checkpoint_keep}: keep at least 1")
        if self.max_in_flight is not None and self.max_in_flight < 0:
            raise ConfigError(f"PARAMSHARD_MAX_IN_FLIGHT={self.max_in_flight}: must be >= 0 pushes")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ConfigError(f"PARAMSHARD_MAX_STALENESS={self.max_staleness}: must be >= 0 steps")
        if self.records is not None and self.records != "stdout" and not self.records.startswith("dir:"):
            raise ConfigError(f"PARAMSHARD_RECORDS={self.records!r}: 'stdout' or 'dir:PATH'")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"PARAMSHARD_METRICS_PORT={self.metrics_port}: must be a port, 1..65535 (0: off)")
        for addr in self.servers:
            _check_address("PARAMSHARD_SERVERS entry", addr)
        if not self.mode.has_servers and self.servers:
            raise ConfigError(f"PARAMSHARD_MODE=collective has no parameter servers, but PARAMSHARD_SERVERS "
                              f"lists {len(self.servers)}: use mode hybrid to keep sparse tables on servers, "
                              f"or start no servers (--servers 0)")
        if self.role == "server":
            if not self.servers:
                raise ConfigError("a server needs PARAMSHARD_SERVERS (its own address among them)")
            if self.server_id is None or not 0 <= self.server_id < len(self.servers):
                raise ConfigError(f"PARAMSHARD_SERVER_ID={self.server_id}: expected 0..{len(self.servers) - 1}")
        if self.role == "trainer":
            if not self.servers and self.mode.has_servers:
                raise ConfigError("a trainer needs PARAMSHARD_SERVERS (comma-separated host:port)")
            if self.collective and self.num_trainers > 1 and not self.collective_addr:
                raise ConfigError(f"PARAMSHARD_MODE={self.mode} with {self.num_trainers} trainers needs "
                                  f"PARAMSHARD_COLLECTIVE_ADDR (host:port of trainer 0's store; "
                                  f"`paramshard launch` and `paramshard run` set it)")
            if not 0 <= self.trainer_id < self.num_trainers:
                raise ConfigError(f"PARAMSHARD_TRAINER_ID={self.trainer_id}: expected 0..{self.num_trainers - 1}")

    @property
    def collective(self) -> bool:
        """Dense gradients are averaged by allreduce among the trainers (``mode.allreduce``)."""
        return self.mode.allreduce

    @property
    def server_mode(self) -> Mode:
        """How the servers apply pushes (``mode.server_mode``)."""
        return self.mode.server_mode

    @property
    def rank_name(self) -> str:
        if self.role == "server":
            return f"server {self.server_id}"
        if self.role == "trainer":
            return f"trainer {self.trainer_id}"
        return "standalone"

    @property
    def log_tag(self) -> str:
        return f"{self.rank_name}, {self.where}" if self.where else self.rank_name

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> "ClusterEnv":
        e = os.environ if environ is None else environ
        servers = _servers(e)
        role = _role(e)
        server_id = _int(e, "PARAMSHARD_SERVER_ID", "PADDLE_PSERVER_ID")
        if server_id is None and e.get("PADDLE_CURRENT_ENDPOINT") in servers:
            server_id = servers.index(e["PADDLE_CURRENT_ENDPOINT"])
        num_trainers = _int(e, "PARAMSHARD_TRAINERS", "PADDLE_TRAINERS_NUM",
                            "PADDLE_INIT_NUM_GRADIENT_SERVERS")
        trainer_id = _int(e, "PARAMSHARD_TRAINER_ID", "PADDLE_TRAINER_ID", "PADDLE_INIT_TRAINER_ID")
        mpi_rank = _int(e, "OMPI_COMM_WORLD_RANK")
        if role is None and mpi_rank is not None and servers:
            # OpenMPI: one script for every rank; the first S ranks serve.
            size = _int(e, "OMPI_COMM_WORLD_SIZE") or 0
            if size <= len(servers):
                raise ConfigError(f"OMPI_COMM_WORLD_SIZE={size} leaves no trainer rank after "
                                  f"{len(servers)} servers: start more ranks")
            if mpi_rank < len(servers):
                role, server_id = "server", mpi_rank
            else:
                role, trainer_id = "trainer", mpi_rank - len(servers)
            num_trainers = size - len(servers)
        return cls(
            role=role, servers=tuple(servers), server_id=server_id,
            num_trainers=num_trainers if num_trainers is not None else 1,
            trainer_id=trainer_id or 0,
            mode=Mode.parse(e.get("PARAMSHARD_MODE", "sync")),
            dispatch=e.get("PARAMSHARD_DISPATCH", "round_robin"),
            min_block_size=_or(_int(e, "PARAMSHARD_MIN_BLOCK_SIZE"), DEFAULT_MIN_BLOCK_SIZE),
            timeout=_or(_float(e, "PARAMSHARD_TIMEOUT"), DEFAULT_TIMEOUT),
            bind=e.get("PARAMSHARD_BIND") or None,
            secret=e.get("PARAMSHARD_SECRET") or None,
            job_id=e.get("PARAMSHARD_JOB_ID", ""),
            keys_dir=e.get("PARAMSHARD_KEYS_DIR") or None,
            insecure=_flag(e, "PARAMSHARD_INSECURE"),
            host=e.get("PARAMSHARD_HOST", "").strip() or None,
            where=e.get("PARAMSHARD_WHERE", ""),
            checkpoint_dir=e.get("PARAMSHARD_CHECKPOINT_DIR") or None,
            checkpoint_every=_or(_int(e, "PARAMSHARD_CHECKPOINT_EVERY"), 0),
            checkpoint_keep=_or(_int(e, "PARAMSHARD_CHECKPOINT_KEEP"), 3),
            resume=e.get("PARAMSHARD_RESUME") or None,
            min_trainers=_int(e, "PARAMSHARD_MIN_TRAINERS"),
            max_restarts=_or(_int(e, "PARAMSHARD_MAX_RESTARTS"), 0),
            max_in_flight=_int(e, "PARAMSHARD_MAX_IN_FLIGHT"),
            metrics_port=_or(_int(e, "PARAMSHARD_METRICS_PORT"), 0),
            max_staleness=_int(e, "PARAMSHARD_MAX_STALENESS"),
            records=e.get("PARAMSHARD_RECORDS") or None,
            collective_addr=e.get("PARAMSHARD_COLLECTIVE_ADDR") or None,
            collective_backend=e.get("PARAMSHARD_COLLECTIVE_BACKEND", "") or "gloo",
            collective_fd=_int(e, "PARAMSHARD_COLLECTIVE_FD"),
            recovering=e.get("PARAMSHARD_RECOVERING", "") not in ("", "0"),
            limits=Limits(**{field: value for field, (variable, _, _) in LIMIT_SPEC.items()
                             if (value := _int(e, variable)) is not None}),
        )

    def to_environ(self) -> dict[str, str]:
        out = {
            "PARAMSHARD_SERVERS": ",".join(self.servers),
            "PARAMSHARD_TRAINERS": str(self.num_trainers),
            "PARAMSHARD_MODE": self.mode,
            "PARAMSHARD_DISPATCH": self.dispatch,
            "PARAMSHARD_MIN_BLOCK_SIZE": str(self.min_block_size),
            "PARAMSHARD_TIMEOUT": repr(self.timeout),
        }
        if self.role:
            out["PARAMSHARD_ROLE"] = self.role
        if self.role == "server":
            out["PARAMSHARD_SERVER_ID"] = str(self.server_id)
        if self.role == "trainer":
            out["PARAMSHARD_TRAINER_ID"] = str(self.trainer_id)
        if self.bind:
            out["PARAMSHARD_BIND"] = self.bind
        if self.secret:
            out["PARAMSHARD_SECRET"] = self.secret
        if self.job_id:
            out["PARAMSHARD_JOB_ID"] = self.job_id
        if self.keys_dir:
            out["PARAMSHARD_KEYS_DIR"] = self.keys_dir
        if self.insecure:
            out["PARAMSHARD_INSECURE"] = "1"
        if self.host:
            out["PARAMSHARD_HOST"] = self.host
        if self.where:
            out["PARAMSHARD_WHERE"] = self.where
        if self.checkpoint_dir:
            out["PARAMSHARD_CHECKPOINT_DIR"] = self.checkpoint_dir
            out["PARAMSHARD_CHECKPOINT_EVERY"] = str(self.checkpoint_every)
            out["PARAMSHARD_CHECKPOINT_KEEP"] = str(self.checkpoint_keep)
        if self.resume:
            out["PARAMSHARD_RESUME"] = self.resume
        if self.min_trainers is not None:
            out["PARAMSHARD_MIN_TRAINERS"] = str(self.min_trainers)
        if self.max_restarts:
            out["PARAMSHARD_MAX_RESTARTS"] = str(self.max_restarts)
        if self.recovering:
            out["PARAMSHARD_RECOVERING"] = "1"
        if self.max_in_flight is not None:
            out["PARAMSHARD_MAX_IN_FLIGHT"] = str(self.max_in_flight)
        if self.metrics_port:
            out["PARAMSHARD_METRICS_PORT"] = str(self.metrics_port)
        if self.max_staleness is not None:
            out["PARAMSHARD_MAX_STALENESS"] = str(self.max_staleness)
        if self.records:
            out["PARAMSHARD_RECORDS"] = self.records
        if self.collective_addr:
            out["PARAMSHARD_COLLECTIVE_ADDR"] = self.collective_addr
        if self.collective_backend != "gloo":
            out["PARAMSHARD_COLLECTIVE_BACKEND"] = self.collective_backend
        if self.collective_fd is not None:
            out["PARAMSHARD_COLLECTIVE_FD"] = str(self.collective_fd)
        out.update(self.limits.to_environ())
        return out


def check_server_count(mode: str, servers: int) -> None:
    """How many servers a mode takes (--servers of launch, run and k8s): none in collective
    mode, at least one in every other."""
    if mode == "collective" and servers != 0:
        raise ConfigError(f"--servers {servers}: --mode collective has no parameter servers (dense gradients are "
                          f"averaged by allreduce among the trainers): use --servers 0, or --mode hybrid to keep "
                          f"sparse tables on servers")
    if mode != "collective" and servers < 1:
        raise ConfigError(f"--servers {servers}: {mode} mode needs at least one server (--servers 0 is for "
                          f"--mode collective)")


def _check_address(what: str, addr: str) -> None:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"{what} {addr!r} is not host:port")


def _or(value, default):
    return default if value is None else value


def _first(e: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    for name in names:
        if e.get(name, "") != "":
            return name, e[name]
    return None


def _int(e: Mapping[str, str], *names: str) -> int | None:
    hit = _first(e, *names)
    if hit is None:
        return None
    try:
        return int(hit[1])
    except ValueError:
        raise ConfigError(f"{hit[0]}={hit[1]!r} is not a whole number") from None


def _flag(e: Mapping[str, str], name: str) -> bool:
    """A yes/no variable: unset, empty or 0 is no, 1 is yes; anything else is a mistake worth naming
    (PARAMSHARD_INSECURE=false must not turn encryption off)."""
    value = e.get(name, "").strip().lower()
    if value in ("", "0", "no", "false"):
        return False
    if value in ("1", "yes", "true"):
        return True
    raise ConfigError(f"{name}={e[name]!r}: expected 1 (yes) or 0 (no)")


def _float(e: Mapping[str, str], *names: str) -> float | None:
    hit = _first(e, *names)
    if hit is None:
        return None
    try:
        return float(hit[1])
    except ValueError:
        raise ConfigError(f"{hit[0]}={hit[1]!r} is not a number") from None


def _role(e: Mapping[str, str]) -> str | None:
    hit = _first(e, "PARAMSHARD_ROLE", "PADDLE_TRAINING_ROLE", "TRAINING_ROLE")
    if hit is None:
        return None
    value = hit[1].strip().lower()
    value = {"pserver": "server"}.get(value, value)
    if value not in ROLES:
        raise ConfigError(f"{hit[0]}={hit[1]!r}: expected server or trainer (PSERVER/TRAINER)")
    return value


def _servers(e: Mapping[str, str]) -> list[str]:
    hit = _first(e, "PARAMSHARD_SERVERS", "PADDLE_PSERVERS_IP_PORT_LIST")
    if hit is not None:
        return [s.strip() for s in hit[1].split(",") if s.strip()]
    hit = _first(e, "PADDLE_INIT_PSERVERS")
    if hit is None:
        return []
    port = e.get("PADDLE_INIT_PORT")
    hosts = [s.strip() for s in hit[1].split(",") if s.strip()]
    if port is None:
        return hosts
    return [h if ":" in h else f"{h}:{port}" for h in hosts]


def variables_markdown() -> str:
    rows = ["| variable | meaning | also read (PaddlePaddle) |", "|---|---|---|"]
    for name, meaning, fallbacks in VARIABLES:
        rows.append(f"| `{name}` | {meaning} | {', '.join(fallbacks) or '-'} |")
    return "\n".join(rows)


def engine_variables_markdown() -> str:
    rows = ["| engine | variable | what `paramshard run` takes from it |", "|---|---|---|"]
    for engine, name, use in ENGINE_VARIABLES:
        shown = name if name.startswith("(") else ", ".join(f"`{n.strip()}`" for n in name.split(","))
        rows.append(f"| {engine} | {shown} | {use} |")
    return "\n".join(rows)
