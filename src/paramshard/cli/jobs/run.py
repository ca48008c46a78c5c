"""`paramshard run --servers S SCRIPT|-m MODULE [ARGS]`: the one command any engine starts on every rank.

This module reads the flags and the engine's world; joining the job (rendezvous,
address exchange, the job's secret) is launch/rank/bootstrap.py's, and starting the
rank in this process (serve, or exec the script) is launch/rank/this_rank.py's.
"""
from __future__ import annotations

import dataclasses
import os
import sys

from paramshard.env import ClusterEnv, check_server_count
from paramshard.errors import ConfigError
from paramshard.launch.rank import target, this_rank
# _job_and_secret, _check_same_keys, _SecretFile: importable from here as before (tests/unit/cli/jobs/test_job_security.py).
from paramshard.launch.rank.bootstrap import _check_same_keys, _job_and_secret, _SecretFile, join  # noqa: F401
from paramshard.launch.rank.world import detect
from paramshard.log import configure
from paramshard.settings.flags import add_flags, contract_changes

HELP = "run one rank of a job started by mpirun, srun, torchrun or Kubernetes: serve or train"
EXAMPLE = ("mpirun -np 4 paramshard run --servers 2 examples/ctr_wide_deep.py",
           "srun -n 4 --kill-on-bad-exit=1 paramshard run --servers 2 examples/ctr_wide_deep.py",
           "torchrun --standalone --nproc-per-node 4 --no-python paramshard run --servers 2 "
           "examples/ctr_wide_deep.py",
           "torchrun --standalone --nproc-per-node 4 --no-python paramshard run --servers 0 --mode collective "
           "examples/digits_mlp.py")


def add_arguments(p) -> None:
    p.add_argument("--servers", type=int, required=True, metavar="S",
                   help="how many ranks serve: ranks 0..S-1 are servers, the rest trainers (0 with --mode "
                        "collective)")
    add_flags(p, "run")     # --mode, --timeout, --insecure, --store-port: from the table (settings/)
    p.add_argument("--run-dir", metavar="DIR",
                   help="a directory every rank can write (shared): each writes its contract and its "
                        "records there; `paramshard report DIR` draws them (README \"Seeing a job\")")
    target.add_module_argument(p)
    target.no_abbreviations(p)
    p.add_argument("script", nargs="?",
                   help="the training script (run by trainers with the job's environment), unless -m MODULE")
    p.add_argument("args", nargs="...", help="the script's own arguments")


def preprocess(argv: list[str]) -> list[str]:
    """`-mMODULE` and `--module=MODULE` become `-m MODULE` (see launch/rank/target.py)."""
    return target.split_attached_module(argv, add_arguments)


def _settings(args, environ) -> ClusterEnv:
    """Everything but the roles, from PARAMSHARD_* and the flags (flags win)."""
    base = ClusterEnv.from_environ(environ)
    changes = contract_changes(args, "run")
    if args.timeout is not None and args.timeout <= 0:
        raise ConfigError(f"--timeout {args.timeout:g}: must be > 0 seconds")
    if args.run_dir:
        changes["records"] = f"dir:{os.path.abspath(args.run_dir)}"
    return dataclasses.replace(base, **changes)


def run(args) -> int:
    if "GLIBC_TUNABLES" not in os.environ:
        this_rank.restart_with_malloc_tunables()
    environ = dict(os.environ)
    args.script, args.module, args.args = target.from_args(args.script, args.module, args.args)
    # A module is looked for by python -m on each trainer: a missing one fails it like any error.
    if args.script is not None and not os.path.isfile(args.script):
        raise ConfigError(f"training script {args.script!r} not found (in {os.getcwd()}){target.module_hint(args.script)}")
    base = _settings(args, environ)
    check_server_count(base.mode, args.servers)
    if base.role is not None:
        return _run_explicit(args, base, environ)
    world = detect(environ)
    if world is None:
        raise ConfigError("no engine found in the environment (no OMPI_COMM_WORLD_RANK, SLURM_PROCID or "
                          "torchrun's RANK/WORLD_SIZE/MASTER_ADDR, no PARAMSHARD_ROLE): start it with mpirun, "
                          "srun or torchrun, or use `paramshard launch` on one machine or over SSH")
    if args.servers >= world.size:
        raise ConfigError(f"--servers {args.servers} leaves no trainer among {world.size} ranks "
                          f"({world.engine}): start more ranks or fewer servers")
    joined = join(world, base, args.servers, (args.script, args.module, args.args), environ, args.store_port)
    return this_rank.start(joined, environ)


def _run_explicit(args, env: ClusterEnv, environ: dict) -> int:
    """PARAMSHARD_ROLE and the addresses are given (Kubernetes, hand-written scripts)."""
    if len(env.servers) != args.servers:
        raise ConfigError(f"--servers {args.servers}, but PARAMSHARD_SERVERS lists {len(env.servers)} "
                          f"addresses: they must agree")
    configure(env.log_tag)
    if env.role == "server":
        return this_rank.serve_given(env)
    this_rank.become((sys.executable, *target.command_words(args.script, args.module, args.args)), env, environ)
