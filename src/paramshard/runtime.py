"""Process entry: read the environment contract once and take the role it names.

``init()`` on a server rank serves until the job ends and then exits the
process, so one script can run every rank (mpirun, Kubernetes). With no
cluster around (plain ``python train.py``) it makes a server inside this
process, so a user can debug without launching anything; the Trainer calls it
directly (server/core/in_process.py), without sockets or a thread.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading

from paramshard.env import ClusterEnv
from paramshard.events import ServerListeners
from paramshard.log import configure, get_logger
from paramshard.mode import Mode
from paramshard.settings.process_variables import OMP_THREADS
from paramshard.server.core.parameter_server import ParameterServer
from paramshard.transport.links import ServerLinks
from paramshard.server.core.in_process import LocalLinks
from paramshard.server.core.idle_watch import default_limit
from paramshard.transport.security import Security

log = get_logger("runtime")
_env: ClusterEnv | None = None
_local_server: ParameterServer | None = None
_lock = threading.Lock()


def init(env: ClusterEnv | None = None) -> ClusterEnv:
    global _env, _local_server
    with _lock:
        if _env is not None and env is None:
            return _env
        env = env or ClusterEnv.from_environ()
        configure(env.log_tag)
        if env.role == "server":
            sys.exit(serve(env))
        if env.role is None and not env.mode.has_servers:
            # No servers in this mode: one trainer, a process group of one.
            env = dataclasses.replace(env, role="trainer", num_trainers=1, trainer_id=0)
            log.info("no cluster in the environment: collective mode with this process as the only trainer")
            take_thread_share(processes=1)
        elif env.role is None:
            _local_server = build_server(dataclasses.replace(env, server_id=0), num_trainers=1,
                                         watch_peers=False, in_process=True)
            env = dataclasses.replace(env, role="trainer", servers=(_local_server.address,),
                                      num_trainers=1, trainer_id=0)
            log.info("no cluster in the environment: training against a server inside this process")
            take_thread_share(processes=2)
        _env = env
        return env


def take_thread_share(processes: int) -> None:
    """torch's intra-op threads for a standalone run: what a trainer rank of the job it stands
    for (1 server + 1 trainer; collective mode: 1 trainer) gets from `paramshard launch` on this
    host (launch/api.py ``thread_environ``), unless OMP_NUM_THREADS is set (the user's choice,
    which torch has read). Left alone, torch starts a thread per core, and on a host where
    anything else runs, each matrix product's OpenMP barrier waits for a descheduled thread:
    the CTR app on 2 shared cores ran about 10x slower standalone than as a launched trainer
    (issue 23). ``torch.set_num_threads`` (it sizes MKL's pool too), since torch may be
    imported already; ``os.environ`` stays as the user set it, for the processes they start."""
    from paramshard.launch.api import thread_environ, usable_cpus
    if os.environ.get(OMP_THREADS.env):
        return
    cpus = usable_cpus()
    threads = int(thread_environ(cpus, processes, environ={})[OMP_THREADS.env])
    import torch
    torch.set_num_threads(threads)
    log.info("standalone: %d torch thread(s), a trainer rank's share of %d CPU(s) in a job of %d process(es); "
             "set OMP_NUM_THREADS to choose", threads, cpus, processes)


def current() -> ClusterEnv:
    """This process's environment; the first call takes its role (``init``: a server rank
    serves and exits, a standalone run starts its in-process server)."""
    return _env if _env is not None else init()


def environment() -> ClusterEnv:
    """This process's environment without taking any role: the one ``init`` settled on, else
    the environment contract as it reads (``ps.shard`` needs no more: pure, no side effect)."""
    return _env if _env is not None else ClusterEnv.from_environ()


def links_for(env: ClusterEnv, who: str | None = None):
    """Links to the servers of ``env``: direct calls when it is this process's own
    in-process server, ServerLinks (sockets) otherwise."""
    if _local_server is not None and env.servers == (_local_server.address,):
        return LocalLinks(_local_server, env.timeout, who=who or env.rank_name)
    return ServerLinks.for_job(env, who=who)


def build_server(env: ClusterEnv, bind: str | None = None, num_trainers: int | None = None,
                 watch_peers: bool = True, in_process: bool = False) -> ParameterServer:
    """``watch_peers=False``: the other servers' addresses are not known yet
    (``ParameterServer.watch_peers`` adds them later). ``in_process``: no socket, the
    server answers ``handle_local`` calls only (``links_for``)."""
    if in_process:
        bind = None
    elif bind is None:
        own_host, _, own_port = env.servers[env.server_id].rpartition(":")
        bind = f"{env.bind or own_host}:{own_port}"
    server = ParameterServer(env.server_id, bind, num_trainers or env.num_trainers, env.server_mode, env.timeout,
                             security=Security.from_env(env), peers=_peers_of(env) if watch_peers else None,
                             limits=env.limits, min_trainers=env.min_trainers,
                             recovering=env.recovering, max_staleness=env.max_staleness,
                             idle_exit=None if in_process else default_limit(env.idle_exit, env.timeout))
    _attach_optional_services(server, env)
    return server


def _peers_of(env: ClusterEnv) -> dict[int, str]:
    """The other servers of this server's job, watched so it does not outlive them."""
    return {i: address for i, address in enumerate(env.servers) if i != env.server_id}


def _attach_optional_services(server: ParameterServer, env: ClusterEnv) -> None:
    from paramshard.server.services.checkpoint_service import attach_checkpoints
    from paramshard.server.services.learning_rates import attach_learning_rates
    from paramshard.server.services.sparse_service import attach_sparse
    from paramshard.server.elastic.migration_service import attach_migration
    attach_migration(server, env, attach_sparse(server, env))
    attach_checkpoints(server)
    attach_learning_rates(server)
    if env.recovery == "bounded-loss":       # the launcher's replica keeper copies this server
        from paramshard.server.elastic.replication import attach_replication
        attach_replication(server)


def serve(env: ClusterEnv, server: ParameterServer | None = None) -> int:
    """Run a server in this thread until its job ends (or SIGTERM); the exit code.
    ``server``: one already built (and bound) for ``env``."""
    server = server or build_server(env)

    def stop(signum, frame):
        log.info("server %d: signal %d, shutting down", env.server_id, signum)
        server.close()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    # Whoever watches the server (/metrics, the run directory's records) is registered in
    # events.py, so this core module names none of them.
    listeners = ServerListeners(env, server)
    code = 1
    try:
        code = server.serve_forever()
        return code
    finally:
        listeners.close(code)
