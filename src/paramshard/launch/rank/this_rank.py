"""Start one rank in this very process: the local end of ``paramshard run``.

An outside engine (mpirun, srun, torchrun, a Kubernetes pod) started this
process for one rank; where ``paramshard launch`` hands a ``RankSpec`` to an
engine that spawns it, here the rank becomes this process: a server serves in
it until the job ends, a trainer replaces it with its script (exec: the
engine's signals and exit codes reach the script directly).
"""
from __future__ import annotations

import dataclasses
import os
import sys
from typing import NoReturn, Sequence

from paramshard.env import ClusterEnv
from paramshard.launch.api import MALLOC_TUNABLES
from paramshard.launch.rank.bootstrap import Joined
from paramshard.runtime import serve


def start(joined: Joined, environ: dict) -> int:
    """Serve (the exit code) or become the trainer's script (never returns)."""
    rank = joined.rank
    if joined.server is not None:
        return serve(rank.env, joined.server)
    env = rank.env
    if joined.store_socket is not None:
        os.set_inheritable(joined.store_socket.fileno(), True)     # kept open across the exec
        env = dataclasses.replace(env, collective_fd=joined.store_socket.detach())
    become(rank.argv, env, environ)


def serve_given(env: ClusterEnv) -> int:
    """A server whose role and addresses were given (Kubernetes, hand-written scripts)."""
    code = serve(env)
    if env.server_id == 0:
        _after_job()
    return code


def become(argv: Sequence[str], env: ClusterEnv, environ: dict) -> NoReturn:
    """Replace this process with ``argv`` (python SCRIPT ARGS, python -m MODULE ARGS) and the job's contract."""
    child_env = {**environ, **env.to_environ(), "PYTHONUNBUFFERED": "1"}
    from paramshard.observe.run_records.rank_records import run_dir_of, write_rank   # a trainer rank's only
    run_dir = run_dir_of(env)
    if run_dir is not None:
        write_rank(run_dir, env.rank_name, env)
    sys.stdout.flush(), sys.stderr.flush()
    os.execve(sys.executable, list(argv), child_env)


def restart_with_malloc_tunables() -> None:
    """glibc reads its tunables at start-up only: run this command again with the
    settings `paramshard launch` gives its processes (launch/api.py MALLOC_TUNABLES)."""
    env = {**os.environ, "GLIBC_TUNABLES": MALLOC_TUNABLES}
    sys.stdout.flush(), sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "paramshard", *sys.argv[1:]], env)


def _after_job() -> None:
    """On Kubernetes, server pods would be restarted after the job: remove them."""
    try:
        from paramshard.launch.engines.k8s_cleanup import delete_job_objects
    except ImportError:
        return
    delete_job_objects()
