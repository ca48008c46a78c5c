"""Process entry: read the environment contract and take the role it names.

``init()`` on a server rank serves until the job ends and then exits the
process, so one script can run every rank (mpirun, Kubernetes). With no
cluster around (plain ``python train.py``) it makes a server inside this
process, so a user can debug without launching anything; the Trainer calls it
directly (server/core/in_process.py), without sockets or a thread.

Nothing is kept in this module: the env ``init`` returns carries what it settled on (a
standalone run's in-process server: ``ClusterEnv.local_server``), and every object gets
its context from its env or its owner. So servers and trainers run as threads in one
process (tests), and ``init`` called again starts a second job in the same interpreter.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING

from paramshard.client.recovery import install      # the links' retry policy is the client's
from paramshard.cpu_shares import thread_environ, usable_cpus
from paramshard.env import ClusterEnv
from paramshard.events import ServerListeners
from paramshard.log import configure, get_logger
from paramshard.settings.process_variables import OMP_THREADS
from paramshard.server.core.in_process import LocalLinks
from paramshard.server.core.parameter_server import IN_PROCESS
from paramshard.transport.links import ServerLinks

if TYPE_CHECKING:
    from paramshard.server.core.parameter_server import ParameterServer

log = get_logger("runtime")


def init(env: ClusterEnv | None = None) -> ClusterEnv:
    """This process's env for its role: a server rank serves and exits; a standalone run
    (no role in the environment) gets a server inside this process (carried by the env
    returned) or, without servers, is the one trainer of its own process group. Each call
    settles anew: a second standalone ``init`` is a second job, with its own server."""
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
        # The server is built when this env's trainer first connects (links_for), not here: a
        # script's ps.init() and its Trainer's own init() (runtime.current) make one server, not two.
        env = dataclasses.replace(env, role="trainer", servers=(IN_PROCESS,), num_trainers=1, trainer_id=0,
                                  local_server=StandaloneServer(dataclasses.replace(env, server_id=0)))
        take_thread_share(processes=2)
    return env


class StandaloneServer:
    """A standalone run's server inside this process (no socket, no thread), made on first use:
    the trainer whose env carries it owns it (``close``)."""

    def __init__(self, env: ClusterEnv):
        self._env = env
        self._server: ParameterServer | None = None
        self._lock = threading.Lock()

    def get(self) -> ParameterServer:
        with self._lock:
            if self._server is None:
                # server/assembly.py imports every service (pandas among them): only a process that builds one
                from paramshard.server.assembly import build_server
                self._server = server = build_server(self._env, num_trainers=1, watch_peers=False, in_process=True)
                log.info("no cluster in the environment: training against a server inside this process")
                return server
            return self._server

    def close(self) -> None:
        with self._lock:
            if self._server is not None:
                self._server.close()


def take_thread_share(processes: int) -> None:
    """torch's intra-op threads for a standalone run: what a trainer rank of the job it stands
    for (1 server + 1 trainer; collective mode: 1 trainer) gets from `paramshard launch` on this
    host (cpu_shares.py ``thread_environ``, the launcher's rule), unless OMP_NUM_THREADS is set
    (the user's choice, which torch has read). Left alone, torch starts a thread per core, and on a host where
    anything else runs, each matrix product's OpenMP barrier waits for a descheduled thread:
    the CTR app on 2 shared cores ran about 10x slower standalone than as a launched trainer
    (issue 23). ``torch.set_num_threads`` (it sizes MKL's pool too), since torch may be
    imported already; ``os.environ`` stays as the user set it, for the processes they start."""
    if os.environ.get(OMP_THREADS.env):
        return
    cpus = usable_cpus()
    threads = int(thread_environ(cpus, processes, environ={})[OMP_THREADS.env])
    import torch        # a standalone trainer's (it has it already): not imported by a server's runtime
    torch.set_num_threads(threads)
    log.info("standalone: %d torch thread(s), a trainer rank's share of %d CPU(s) in a job of %d process(es); "
             "set OMP_NUM_THREADS to choose", threads, cpus, processes)


def current() -> ClusterEnv:
    """The env of a Trainer built without one: ``init()`` (a standalone run gets its own
    in-process server; a rank of a job reads its contract)."""
    return init()


def environment() -> ClusterEnv:
    """This process's environment without taking any role: the environment contract as it
    reads (pure, no side effect)."""
    return ClusterEnv.from_environ()


def links_for(env: ClusterEnv, who: str | None = None):
    """A trainer's links to the servers of ``env``: direct calls to its in-process server
    (``env.local_server``), else ServerLinks (sockets) with its recovery's retry policy."""
    if env.local_server is not None:
        # ps.init()'s StandaloneServer, or a ParameterServer a test built (server/assembly.py)
        server = env.local_server.get() if isinstance(env.local_server, StandaloneServer) else env.local_server
        return LocalLinks(server, env.timeout, who=who or env.rank_name)
    links = ServerLinks.for_job(env, who=who)
    install(links, env)
    return links


def serve(env: ClusterEnv, server: ParameterServer | None = None) -> int:
    """Run a server in this thread until its job ends (or SIGTERM); the exit code.
    ``server``: one already built (and bound) for ``env``."""
    if server is None:
        from paramshard.server.assembly import build_server     # see init: every service's imports
        server = build_server(env)

    def stop(signum, frame):
        log.info("server %d: signal %d, shutting down", env.server_id, signum)
        server.close()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    # Whoever watches the server (/metrics, the run directory's records) registered itself
    # with events.py from the top (paramshard/__init__.py), so this module names none of them.
    listeners = ServerListeners(env, server)
    code = 1
    try:
        code = server.serve_forever()
        return code
    finally:
        listeners.close(code)
