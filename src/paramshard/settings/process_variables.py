"""Settings read where they are used, not part of ``ClusterEnv``: one process's own concerns
(its log level, the data cache), one engine's (Slurm's store port, Kubernetes' cleanup),
and other programs' variables paramshard reads or sets (glibc, OpenMP, gloo).

Each is a module-level name so its users read it through the table (``CACHE.read(os.environ)``)
and the docs list it with the others.
"""
from __future__ import annotations

from paramshard.settings.contract import _yes_no
from paramshard.settings.setting import Setting, flag

SECRET_DIR = Setting(
    "PARAMSHARD_SECRET_DIR", "`paramshard run` under srun or torchrun without PARAMSHARD_SECRET: the directory, "
    "shared by every rank's host and private to this user, where the first rank writes the job's secret for the "
    "others (default ~/.paramshard/secrets)", scopes=frozenset(), parse=lambda text: text.strip() or None)
STORE_PORT = Setting(
    "PARAMSHARD_STORE_PORT", "Slurm: port of the address store `paramshard run` hosts on the first node "
    "(default 29600 + job id % 2000)", scopes=frozenset(), parse=int, invalid=" is not a port",
    flags=(flag("run", "--store-port", "Slurm only: port of the address store on the first node (default: "
                "PARAMSHARD_STORE_PORT, else 29600 + job id %% 2000)", type=int, metavar="PORT"),))
K8S_DELETE = Setting(
    "PARAMSHARD_K8S_DELETE", "Kubernetes: objects server 0 deletes when the job ends "
    "(`services/NAME,statefulsets/NAME`; set by `paramshard k8s`)", scopes=frozenset())
K8S_NAMESPACE = Setting(
    "PARAMSHARD_K8S_NAMESPACE", "Kubernetes: namespace of those objects (from the downward API)", scopes=frozenset())
K8S_API_URL = Setting(
    "PARAMSHARD_K8S_API_URL", "Kubernetes: API server URL instead of the in-cluster one (tests)", scopes=frozenset())
LOG_LEVEL = Setting(
    "PARAMSHARD_LOG_LEVEL", "log level of every paramshard process: DEBUG, INFO, WARNING or ERROR (default INFO)",
    scopes=frozenset(), default="", keep_empty=True)
CACHE = Setting(
    "PARAMSHARD_CACHE", "where downloaded data sets and wheels are kept (`paramshard dataset`; default "
    "~/.cache/paramshard)", scopes=frozenset(), keep_empty=True)
OMPI_RANK = Setting(
    "OMPI_COMM_WORLD_RANK", "under OpenMPI: ranks 0..S-1 are servers, the rest trainers (with "
    "OMPI_COMM_WORLD_SIZE)", scopes=frozenset())
OMP_THREADS = Setting(
    "OMP_NUM_THREADS", "threads of torch's intra-op pool in each process (read by torch at import); `paramshard "
    "launch` sets it and MKL_NUM_THREADS to the CPUs of the host (its affinity) divided by the job's processes "
    "there, at least 1, unless it is set already: then it passes that value on; a standalone run (no launcher) "
    "gives torch the share of a trainer rank of 1 server + 1 trainer (collective mode: 1 trainer)",
    scopes=frozenset())
MKL_THREADS = Setting(
    "MKL_NUM_THREADS", "MKL's thread pool, set with OMP_NUM_THREADS; a value of the user's is passed on",
    scopes=frozenset())
GLIBC_TUNABLES = Setting(
    "GLIBC_TUNABLES", "glibc's malloc settings; unset, `paramshard launch` and `paramshard run` give every process "
    "a heap that is never trimmed and huge pages for big blocks (launch/api.py MALLOC_TUNABLES)",
    scopes=frozenset(), keep_empty=True)
GLOO_IFNAME = Setting(
    "GLOO_SOCKET_IFNAME", "collective and hybrid modes: the network interface gloo uses; unset, each trainer "
    "sets it to the interface on the route towards trainer 0's store", scopes=frozenset())
FORK = Setting(
    "PARAMSHARD_FORK", "`1`: `paramshard launch` forks its local ranks from one interpreter that has imported "
    "torch, pandas, numba and paramshard (launch/engines/fork_server.py), as `--fork` does; a job over SSH (`--hosts`) "
    "ignores it (with a warning), where `--fork` is refused", scopes=frozenset(), parse=_yes_no,
    invalid=": expected 1 (yes) or 0 (no)", default=False,
    flags=(flag("launch", "--fork", "start the ranks on this machine as forks of one interpreter that has imported "
                "torch, pandas, numba and paramshard once, instead of each starting Python anew (also "
                "PARAMSHARD_FORK=1); not with --hosts", action="store_true"),))
FORK_SERVER = Setting(
    "PARAMSHARD_FORK_SERVER", "with --fork (or PARAMSHARD_FORK=1): the socket of a shared fork server that has "
    "imported torch, pandas, numba and paramshard once for every job started while it runs (`python -m "
    "paramshard.launch.engines.zygote_host PATH`; the test suite starts one per worker); each launcher gets its "
    "own zygote forked from it", scopes=frozenset())

# In docs/environment.md's order, after the contract.
PROCESS: tuple[Setting, ...] = (SECRET_DIR, STORE_PORT, K8S_DELETE, K8S_NAMESPACE, K8S_API_URL, LOG_LEVEL, CACHE,
                                OMPI_RANK, OMP_THREADS, MKL_THREADS, GLIBC_TUNABLES, GLOO_IFNAME, FORK, FORK_SERVER)
