"""The environment contract (DESIGN appendix A.3, docs/environment.md): declared in settings/.

Processes read it once, at entry, into a frozen ``ClusterEnv``. The launcher
writes it with ``ClusterEnv.to_environ``; SSH, OpenMPI or Kubernetes set the
same variables, so one script runs under any engine.

The variables themselves are declared in ``paramshard.settings`` (one table): each
field of ``ClusterEnv``, its reading, its checks and its writing come from there.
Only the rules between settings (a server needs the server list, ...) are written here.
"""
from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any, Mapping

from paramshard.errors import ConfigError
from paramshard.mode import MODES, PS_MODES, Mode  # noqa: F401 - re-exported for the commands
from paramshard.settings import fields as _fields
from paramshard.settings.contract import (COLLECTIVE_BACKENDS, DEFAULT_MIN_BLOCK_SIZE, DEFAULT_TIMEOUT,  # noqa: F401
                                DISPATCHERS, ROLES, first_int)
from paramshard.settings.docs import engine_variables_markdown, variables_markdown  # noqa: F401
from paramshard.settings.engines import ENGINE_VARIABLES  # noqa: F401
from paramshard.settings.setting import JOB


if TYPE_CHECKING:    # the fields the table adds, for the checker (settings/stubs.py); object at run time
    from paramshard.settings.config_fields import ClusterEnvFields
else:
    ClusterEnvFields = object


@dataclasses.dataclass(frozen=True)
@_fields.with_fields(JOB)
class ClusterEnv(ClusterEnvFields):
    """One rank's contract. Fields: one per setting of scope JOB (settings/contract.py), in
    the table's order; e.g. ``role`` (None: standalone), ``servers``, ``mode`` (a plain
    string is parsed, Mode.parse), ``limits``, ``max_in_flight`` (None: 1 in async mode, 0 in sync)."""

    # Not a setting (never in the environment): the in-process server of a standalone run, made
    # by ``runtime.init`` (a StandaloneServer, built when the trainer first connects) or a
    # ParameterServer a test built; this env's trainer talks to it by direct calls (``runtime.links_for``).
    # The env carries it, not a module of this process, so two standalone jobs (tests, a
    # notebook) each have their own. None: the servers are ``servers``, over sockets.
    local_server: Any = dataclasses.field(default=None, compare=False, repr=False, kw_only=True)

    def __post_init__(self):
        _fields.validate(self)       # each field by its own setting, in the table's order
        if self.insecure and (self.secret or self.keys_dir):
            raise ConfigError(f"PARAMSHARD_INSECURE=1 (--insecure) asks for plain TCP, but "
                              f"{'PARAMSHARD_SECRET' if self.secret else 'PARAMSHARD_KEYS_DIR'} is set too: "
                              f"unset one of them")
        if not self.mode.has_servers and self.servers:
            raise ConfigError(f"PARAMSHARD_MODE=collective has no parameter servers, but PARAMSHARD_SERVERS "
                              f"lists {len(self.servers)}: use mode hybrid to keep sparse tables on servers, "
                              f"or start no servers (--servers 0)")
        if self.delta_dir and not self.mode.dense_on_servers:
            # The servers publish what they hold; in these modes the dense parameters live on the
            # trainers, so a replica would serve the dense values the chief wrote at the start.
            raise ConfigError(f"PARAMSHARD_DELTA_DIR (--deltas) with PARAMSHARD_MODE={self.mode}: the servers publish "
                              f"the model's deltas, and in {self.mode} mode the dense parameters are not on servers "
                              f"(allreduce among the trainers): use --mode sync or async to serve a model while it "
                              f"learns")
        if self.geo_k is not None and not self.mode.local_rounds:
            raise ConfigError(f"PARAMSHARD_GEO_K={self.geo_k} (--geo-k) is for --mode geo; this job's mode is "
                              f"{self.mode}: drop --geo-k, or use --mode geo")
        if self.mode.local_rounds:
            _check_geo(self)
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
        values = _fields.read(e)
        mpi_rank = first_int(e, "OMPI_COMM_WORLD_RANK")
        servers = values["servers"]
        if values["role"] is None and mpi_rank is not None and servers:
            # OpenMPI: one script for every rank; the first S ranks serve.
            size = first_int(e, "OMPI_COMM_WORLD_SIZE") or 0
            if size <= len(servers):
                raise ConfigError(f"OMPI_COMM_WORLD_SIZE={size} leaves no trainer rank after "
                                  f"{len(servers)} servers: start more ranks")
            if mpi_rank < len(servers):
                values.update(role="server", server_id=mpi_rank)
            else:
                values.update(role="trainer", trainer_id=mpi_rank - len(servers))
            values["num_trainers"] = size - len(servers)
        return cls(**values)

    def to_environ(self) -> dict[str, str]:
        return _fields.to_environ(self)


def _check_geo(env: ClusterEnv) -> None:
    """What geo mode does not do (yet), refused before anything starts (docs/modes.md, GEO)."""
    if env.max_staleness is not None and env.max_staleness < 1:
        raise ConfigError(f"--max-staleness {env.max_staleness}: in geo mode it bounds k, the local steps between "
                          f"two sends, which is at least 1")
    if isinstance(env.geo_k, int) and env.max_staleness is not None and env.geo_k > env.max_staleness:
        raise ConfigError(f"--geo-k {env.geo_k} is over --max-staleness {env.max_staleness}: a replica would fall "
                          f"further behind than the bound allows; lower one or raise the other")
    refused = []
    if env.delta_dir:
        refused.append("--deltas (not tested with rounds yet; use --mode sync or async to serve a model while "
                       "it learns)")
    if env.partitions:
        refused.append("--partitions (servers added or removed while the replicas train: not built yet)")
    if refused:
        raise ConfigError("--mode geo does not support " + "; ".join(refused))


def check_server_count(mode: "str | Mode", servers: int) -> None:
    """How many servers a mode takes (--servers of launch, run and k8s): none in collective
    mode, at least one in every other."""
    mode = Mode.parse(mode)
    if not mode.has_servers and servers != 0:
        raise ConfigError(f"--servers {servers}: --mode collective has no parameter servers (dense gradients are "
                          f"averaged by allreduce among the trainers): use --servers 0, or --mode hybrid to keep "
                          f"sparse tables on servers")
    if mode.has_servers and servers < 1:
        raise ConfigError(f"--servers {servers}: {mode} mode needs at least one server (--servers 0 is for "
                          f"--mode collective)")
