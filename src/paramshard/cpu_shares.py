"""A process's share of its host's CPUs: OMP_NUM_THREADS and MKL_NUM_THREADS for one of the
processes a host runs. The launcher sets them for the ranks it starts (launch/api.py) and a
standalone run takes a trainer rank's share (runtime.take_thread_share): one rule, below both."""
from __future__ import annotations

import os
from typing import Mapping

from paramshard.settings.process_variables import MKL_THREADS, OMP_THREADS

# torch (OpenMP) and MKL size their thread pools by the host's cores, once per process: S + T
# processes on one host would each start a pool of all its cores and fight over them.
THREAD_VARIABLES = (OMP_THREADS.env, MKL_THREADS.env)


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity (taskset, a cgroup cpuset), else all."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:           # not Linux
        return os.cpu_count() or 1


def thread_environ(cpus: int, processes: int, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """OMP_NUM_THREADS and MKL_NUM_THREADS for one of ``processes`` sharing ``cpus``: an equal
    share, at least 1. A user's OMP_NUM_THREADS (in ``environ``, the launcher's) wins, as
    does a MKL_NUM_THREADS of theirs; both are passed on as they are."""
    environ = os.environ if environ is None else environ
    own = {name: environ[name] for name in THREAD_VARIABLES if environ.get(name)}
    if "OMP_NUM_THREADS" in own:
        return own
    return {**dict.fromkeys(THREAD_VARIABLES, str(max(1, cpus // processes))), **own}
