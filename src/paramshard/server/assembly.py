"""Building a server: the one function that makes a ParameterServer for a ClusterEnv and adds
its services (``runtime`` serves it, ``launch/rank/bootstrap.py`` binds it before the job's
addresses are known, tests build servers as threads with it).

The order services are added in is the order their request hooks run in: the core loop asks
each hook in turn (``ParameterServer._admit``: a refusal raises; a HOLD stops there, and the
held request, handed back, is admitted again from the first hook) and tells them ``applied``
and ``tick`` in the same order. ``SERVICES`` states it; tests/unit/server/test_assembly.py
builds servers and checks it. Why this order:

1. the constructor's, on every server: ``DenseHandlers``, ``ControlHandlers`` (its hook,
   ``EpochCheck``, runs first: a request of a stale epoch is refused before any other hook
   holds it), ``TrainerBarriers``, ``ShardService`` (the data-shard queue, served by server 0);
2. ``SparseService``, the tables every later service reads;
3. ``MigrationService`` then ``DenseMigration`` (``MigrationHook``, ``DenseMoveHook``): a request
   for a partition or block this server no longer owns is refused (the trainer re-routes) before
   the checkpoint's gate would hold it here;
4. ``CheckpointService`` (``PushGateHook``, ``DropGuard``) and ``LearningRates``;
5. ``ReplicationService`` (``ReplayGuard``), bounded-loss recovery only: last, it sees only requests
   every other hook accepted;
6. ``DeltaService`` (``DeltaHook``), with PARAMSHARD_DELTA_DIR only: it accepts everything, and after
   every other hook heard of a request it publishes what changed when due (server/services/delta_service.py).
"""
from __future__ import annotations

from paramshard.env import ClusterEnv
from paramshard.errors import ConfigError
from paramshard.server.core.idle_watch import default_limit
from paramshard.server.core.parameter_server import ParameterServer
from paramshard.server.elastic.migration_service import attach_migration
from paramshard.server.elastic.replication import attach_replication
from paramshard.server.services.checkpoint_service import attach_checkpoints
from paramshard.server.services.delta_service import attach_deltas
from paramshard.server.services.learning_rates import attach_learning_rates
from paramshard.server.services.sparse_service import attach_sparse
from paramshard.transport.security import Security

# The services of a built server, in the order they were added (and their hooks run in).
SERVICES = ("DenseHandlers", "ControlHandlers", "TrainerBarriers", "ShardService",     # the constructor's
            "SparseService", "MigrationService", "DenseMigration", "CheckpointService", "LearningRates")
BOUNDED_LOSS_SERVICES = ("ReplicationService",)     # after SERVICES, with PARAMSHARD_RECOVERY=bounded-loss
DELTA_SERVICES = ("DeltaService",)                  # last, with PARAMSHARD_DELTA_DIR


def build_server(env: ClusterEnv, bind: str | None = None, num_trainers: int | None = None,
                 watch_peers: bool = True, in_process: bool = False) -> ParameterServer:
    """A server of ``env``'s job with all its services. ``bind``: host:port (default: its
    own address in ``env.servers``, on ``env.bind`` if set). ``watch_peers=False``: the other
    servers' addresses are not known yet (``ParameterServer.watch_peers`` adds them later).
    ``in_process``: no socket, the server answers ``handle_local`` calls only (a trainer in this
    process talks to it through server/core/in_process.LocalLinks)."""
    server_id = env.server_id
    if server_id is None:
        raise ConfigError("a server's env names no server (PARAMSHARD_SERVER_ID): give its server_id")
    if in_process:
        bind = None
    elif bind is None:
        own_host, _, own_port = env.servers[server_id].rpartition(":")
        bind = f"{env.bind or own_host}:{own_port}"
    server = ParameterServer(server_id, bind, num_trainers or env.num_trainers, env.server_mode, env.timeout,
                             security=Security.from_env(env), peers=peers_of(env) if watch_peers else None,
                             limits=env.limits, min_trainers=env.min_trainers,
                             recovering=env.recovering,
                             max_staleness=env.max_staleness if env.mode.servers_bound_staleness else None,
                             idle_exit=None if in_process else default_limit(env.idle_exit, env.timeout))
    add_services(server, env)
    return server


def peers_of(env: ClusterEnv) -> dict[int, str]:
    """The other servers of this server's job, watched so it does not outlive them."""
    return {i: address for i, address in enumerate(env.servers) if i != env.server_id}


def add_services(server: ParameterServer, env: ClusterEnv) -> None:
    """The services after the constructor's, in the order of ``SERVICES``."""
    sparse = attach_sparse(server, env)
    attach_migration(server, env, sparse)     # SparseService, MigrationService + DenseMigration
    attach_checkpoints(server)
    attach_learning_rates(server)
    if env.recovery == "bounded-loss":       # the launcher's replica keeper copies this server
        attach_replication(server)
    attach_deltas(server, env, sparse)       # PARAMSHARD_DELTA_DIR set: publish deltas
