"""One contract for launching a job, whatever starts the processes.

- ``LaunchConfig``: what the user asked for (script, counts, mode, security).
- ``JobSpec``: every rank with its host and its environment contract.
- ``Engine`` and ``Process`` (launch/engines/process.py): starts one rank somewhere and
  hands back a process the loop can watch; the local engine and the SSH engine
  are two implementations.
- ``Launcher`` (launch/supervision/launcher.py): one run of a job, restarting servers in
  place, built by ``build_launcher`` (launch/supervision/build.py) from a LaunchConfig and a
  ``Placement`` (launch/engines/placement.py: this machine, or hosts over SSH) and never
  subclassed; launch/supervision/supervisor.py runs the job again from a checkpoint when the
  restart policy (launch/supervision/restart_policy.py) says so; launch/supervision/rank_exit.py says
  how each rank ended and writes the failure summary.
"""
from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Mapping, Sequence

from paramshard.cpu_shares import THREAD_VARIABLES, thread_environ, usable_cpus  # noqa: F401 - the launcher's rule
from paramshard.env import ClusterEnv, check_server_count
from paramshard.errors import ConfigError
from paramshard.mode import Mode
from paramshard.settings.fields import launched, with_fields
from paramshard.settings.process_variables import GLIBC_TUNABLES
from paramshard.settings.setting import LAUNCH
from paramshard.transport.security import new_secret
from paramshard.launch.rank.target import check as check_target, command_words, module_hint

# libzmq mallocs every received message. With glibc's defaults a big message
# gets fresh pages (mmap, or a heap that was just trimmed), so page faults
# dominate large transfers. Keep everything up to 32 MiB on a heap that is
# never trimmed, and back larger blocks with transparent huge pages. Measured
# (benchmarks/RESULTS.md): 16 MiB push+pull 0.55x -> 0.76x of raw pyzmq under
# the same settings; 64 MiB round trip 152 -> 87 ms.
MALLOC_TUNABLES = ("glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=33554432:"
                   "glibc.malloc.trim_threshold=2147483648")


if TYPE_CHECKING:    # the fields the table adds, for the checker (settings/stubs.py); object at run time
    from paramshard.settings.config_fields import LaunchConfigFields
else:
    LaunchConfigFields = object


@dataclasses.dataclass(frozen=True)
@with_fields(LAUNCH)
class LaunchConfig(LaunchConfigFields):
    """What the user asked for. The launcher's own fields are below; every setting the launcher
    passes on to the ranks (scope LAUNCH in settings/contract.py: trainers, mode, timeout, secret,
    checkpoints, ...) is a field too, generated from the table and copied by ``base_env``. A
    secret of None means one is made for the job (CurveZMQ), unless keys_dir or insecure."""
    script: str | None = None      # what each trainer runs: a script, or `module` below
    script_args: tuple[str, ...] = ()
    servers: int = 1
    host: str = "127.0.0.1"
    check_script: bool = True      # False when the script lives on other hosts only
    module: str | None = None      # a module, run as python -m (script_args are then its arguments)
    fork: bool = False             # --fork: ranks forked from a pre-imported interpreter (local engine only)

    def __post_init__(self):
        object.__setattr__(self, "mode", Mode.parse(self.mode))
        check_server_count(self.mode, self.servers)
        if not (self.secret or self.keys_dir or self.insecure):
            # The launcher owns every rank's environment: encrypt unless told otherwise.
            object.__setattr__(self, "secret", new_secret())
        if not self.mode.checkpoints and (self.checkpoint_dir or self.resume or self.max_restarts):
            raise ConfigError(f"--mode {self.mode}: checkpoints are not available in this mode yet "
                              f"(drop --checkpoint-dir, --resume and --max-restarts, or use sync mode)")
        if self.recovery == "bounded-loss" and (self.mode.waits_every_step or not self.mode.has_servers):
            raise ConfigError(f"--recovery bounded-loss: --mode {self.mode} cannot lose updates (a sync step needs "
                              f"every server at the same step, which only a rollback restores); use --mode async, "
                              f"or --recovery rollback (the default)")
        if self.trainers < 1:
            raise ConfigError(f"--trainers {self.trainers}: a job needs at least one trainer")
        if self.max_staleness is not None and self.mode.waits_every_step:
            raise ConfigError(f"--max-staleness {self.max_staleness}: bounds async staleness; sync mode "
                              f"already waits for every trainer each step (use --mode async)")
        if self.min_trainers is not None and (not self.mode.elastic_trainers or
                                              not 1 <= self.min_trainers <= self.trainers):
            raise ConfigError(f"--trainers {self.min_trainers}:{self.trainers} (or --min-trainers "
                              f"{self.min_trainers}): an elastic job needs --mode sync, async or geo and a minimum "
                              f"in 1..{self.trainers}")
        check_target(self.script, self.module)
        # A module is looked for where the trainers run: a missing one fails them like any error.
        if self.check_script and self.script is not None and not os.path.isfile(self.script):
            raise ConfigError(f"training script {self.script!r} not found{module_hint(self.script)}")
        # Building the contract validates mode, dispatch, block size, timeout.
        self.base_env(["127.0.0.1:1"] * self.servers, "127.0.0.1:1" if self.collective else None)

    @property
    def collective(self) -> bool:
        """The trainers form a process group (collective, hybrid): trainer 0 hosts its store."""
        return self.mode.allreduce

    def base_env(self, servers: Sequence[str], collective_addr: str | None = None) -> ClusterEnv:
        """Every rank's contract but its role: the settings this config carries (generated)."""
        return ClusterEnv(role=None, servers=tuple(servers), collective_addr=collective_addr, **launched(self))


@dataclasses.dataclass(frozen=True)
class RankSpec:
    name: str                      # "server 0", "trainer 1"
    env: ClusterEnv                # its whole environment contract
    argv: tuple[str, ...]          # what runs (the engine decides where and how)
    host: str | None = None        # None: this machine
    # Variables beyond the contract, for every engine alike (the thread counts).
    extra_environ: tuple[tuple[str, str], ...] = ()

    @property
    def tag(self) -> str:
        return f"{self.host} | {self.name}" if self.host else self.name

    def environ(self) -> dict[str, str]:
        """The variables this rank needs beyond its host's own environment."""
        out = self.env.to_environ()
        out.update(self.extra_environ)
        out["PYTHONUNBUFFERED"] = "1"
        given = GLIBC_TUNABLES.read(os.environ)
        out[GLIBC_TUNABLES.env] = MALLOC_TUNABLES if given is None else given
        return out


@dataclasses.dataclass(frozen=True)
class JobSpec:
    servers: tuple[RankSpec, ...]
    trainers: tuple[RankSpec, ...]

    @classmethod
    def build(cls, config: LaunchConfig, addresses: Sequence[str], python: str,
              server_hosts: Sequence[str | None] | None = None,
              trainer_hosts: Sequence[str | None] | None = None, script: str | None = None,
              threads: Mapping[str | None, dict[str, str]] | None = None,
              collective_addr: str | None = None) -> "JobSpec":
        """Rank -> environment. ``addresses``: where each server listens (its own host's
        address); ``*_hosts``: where each rank runs (None entries: this machine); ``script``:
        the script's path where it runs; ``threads``: host -> its thread variables (default:
        this machine's CPUs shared by the ranks placed on it, see ``thread_environ``);
        ``collective_addr``: where trainer 0 hosts the trainers' store (collective, hybrid)."""
        if config.collective and not collective_addr:
            raise ConfigError(f"{config.mode} mode: the trainers' store address (trainer 0's host:port) is missing")
        base = config.base_env(addresses, collective_addr)
        server_hosts = server_hosts or [None] * config.servers
        trainer_hosts = trainer_hosts or [None] * config.trainers
        if threads is None:      # the ranks on this machine share its CPUs (other hosts: nothing set)
            here = [*server_hosts, *trainer_hosts].count(None)
            threads = {None: thread_environ(usable_cpus(), here)} if here else {}
        trainer_argv = (python, *command_words(script or config.script, config.module, config.script_args))

        def rank(name: str, env: ClusterEnv, argv: tuple[str, ...], host: str | None) -> RankSpec:
            return RankSpec(name, env, argv, host, tuple(sorted(threads.get(host, {}).items())))

        servers = tuple(rank(f"server {i}", dataclasses.replace(base, role="server", server_id=i),
                             (python, "-m", "paramshard", "server"), server_hosts[i])
                        for i in range(config.servers))
        trainers = tuple(rank(f"trainer {i}", dataclasses.replace(base, role="trainer", trainer_id=i),
                              trainer_argv, trainer_hosts[i])
                         for i in range(config.trainers))
        return cls(servers, trainers)


# The supervision loop and what it reads of a rank's exit live in their own modules;
# their names stay importable from here.
from paramshard.launch.engines.process import Engine, Process  # noqa: E402
from paramshard.launch.supervision.rank_exit import exit_status, failure_summary, first_failure, lost_a_peer  # noqa: E402


def __getattr__(name: str):
    # launch/supervision/launcher.py imports this module (RankSpec, JobSpec): Launcher and its builder
    # are looked up lazily.
    if name == "Launcher":
        from paramshard.launch.supervision.launcher import Launcher
        return Launcher
    if name == "build_launcher":
        from paramshard.launch.supervision.build import build_launcher
        return build_launcher
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
