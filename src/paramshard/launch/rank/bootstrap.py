"""A rank started by an outside engine (mpirun, srun, torchrun) joins its job: ``paramshard run``.

Ranks below S serve, the rest train. The rank comes from the engine (see
launch/rank/world.py); servers bind a free port on their own host's address and
every rank learns every server's address through the engine (launch/rank/rendezvous.py).
In collective and hybrid modes the first trainer also binds a port, for the
trainers' torch.distributed store, and hands the listening socket to its script
(PARAMSHARD_COLLECTIVE_FD): nothing can take the port between the exchange and
the store. ``--servers 0`` (collective mode): every rank trains.

What ``join`` hands back is the rank as ``paramshard launch`` describes it, a
``RankSpec`` (name, whole contract, what it runs), plus the server already bound
for a server rank; launch/rank/this_rank.py then starts it in this very process.
"""
from __future__ import annotations

import dataclasses
import socket
import sys
import uuid
from pathlib import Path
from typing import Any, Sequence

from paramshard.env import ClusterEnv
from paramshard.errors import ConfigError
from paramshard.log import configure, get_logger
from paramshard.transport.security import Security, new_secret
from paramshard.launch.api import RankSpec
from paramshard.launch.rank.job_secret import FIX, fingerprint, shared_secret
from paramshard.launch.rank.rendezvous import exchange_for, own_address
from paramshard.launch.rank.target import command_words
from paramshard.launch.rank.world import World

log = get_logger("run")


@dataclasses.dataclass(frozen=True)
class Joined:
    """This process's rank, once the job's addresses are known."""
    rank: RankSpec
    server: Any = None                  # a server rank: its ParameterServer, bound and watching its peers
    store_socket: socket.socket | None = None   # the first trainer of a collective job: its store's socket


def join(world: World, base: ClusterEnv, servers: int, target: tuple[str | None, str | None, Sequence[str]],
         environ: dict, store_port: int | None = None) -> Joined:
    """Rendezvous with the other ranks of ``world``: ``servers`` of them serve; ``target``:
    (script, module, its arguments) that the trainers run."""
    is_server = world.rank < servers
    role_name = f"server {world.rank}" if is_server else f"trainer {world.rank - servers}"
    configure(f"{role_name}, rank {world.rank} on {world.node}")   # before the rendezvous, which may fail
    exchange, world = exchange_for(world, environ, base.timeout, store_port)
    job_id, secret, secret_file = _job_and_secret(base, world, exchange, environ, servers=servers)
    common = dataclasses.replace(base, num_trainers=world.size - servers, job_id=job_id, secret=secret,
                                 where=f"rank {world.rank} on {world.node}")

    server = store_socket = None
    record = {"rank": world.rank, "node": world.node, "server": None}
    if secret_file is not None:     # ranks that read different files (hosts not sharing it) must not start
        assert secret is not None   # read from that file
        record["keys"] = fingerprint(Security.from_secret(secret, job_id).server_public)
    if base.collective and world.rank == servers:
        # The first trainer hosts the trainers' store: bound now, handed to the script.
        host = own_address(world, environ)
        store_socket = socket.create_server((base.bind or host, 0), backlog=1024)
        record["collective"] = f"{host}:{store_socket.getsockname()[1]}"
    if is_server:
        from paramshard.server.assembly import build_server     # every service (pandas): server ranks only
        host = own_address(world, environ)
        provisional = dataclasses.replace(common, role="server", server_id=world.rank,
                                          servers=(f"{host}:0",) * servers)
        server = build_server(provisional, bind=f"{base.bind or host}:0", watch_peers=False)
        record["server"] = f"{host}:{server.address.rpartition(':')[2]}"
    try:
        records = exchange.allgather(record)
    finally:
        exchange.close()
    if secret_file is not None:
        _check_same_keys(records, secret_file)
        if secret_file.made:
            secret_file.path.unlink(missing_ok=True)    # every rank read it before it reported
    addresses = tuple(r["server"] for r in records[:servers])
    if base.collective:
        common = dataclasses.replace(common, collective_addr=records[servers]["collective"])
    if world.rank == 0:
        _log_world(world, records, servers)
    if server is not None:          # is_server: built above
        env = dataclasses.replace(common, role="server", server_id=world.rank, servers=addresses)
        # The engine's name for each trainer, so that a lost trainer is named the way the engine names it.
        places = {r["rank"] - servers: f"rank {r['rank']} on {r['node']}" for r in records[servers:]}
        server.watch_peers({i: a for i, a in enumerate(addresses) if i != world.rank}, places)
        return Joined(RankSpec(role_name, env, (sys.executable, "-m", "paramshard", "server")), server=server)
    # Its host's address: its /metrics listens there, not on every interface.
    env = dataclasses.replace(common, role="trainer", trainer_id=world.rank - servers, servers=addresses,
                              host=own_address(world, environ))
    return Joined(RankSpec(role_name, env, (sys.executable, *command_words(*target))), store_socket=store_socket)


def _log_world(world: World, records: list[dict], servers: int) -> None:
    log.info("%d servers, %d trainers under %s: %s", servers, world.size - servers, world.engine,
             "; ".join(f"{'server' if r['rank'] < servers else 'trainer'} "
                       f"{r['rank'] if r['rank'] < servers else r['rank'] - servers}: "
                       f"rank {r['rank']} on {r['node']}" + (f" at {r['server']}" if r["server"] else "")
                       for r in records))


@dataclasses.dataclass(frozen=True)
class _SecretFile:
    path: Path
    made: bool       # this rank wrote it (and removes it once every rank has read it)


def _job_and_secret(base: ClusterEnv, world: World, exchange, environ: dict,
                    servers: int = 1) -> tuple[str, str | None, _SecretFile | None]:
    """The job id and the secret every rank uses, and the file it came from (srun, torchrun).

    A secret or keys the user gave, or --insecure, win. Otherwise the ranks need one
    secret that no other process can learn: under mpirun rank 0 makes it and sends it
    over MPI (with the job's name: mpirun names no job); under srun and torchrun the
    stores are open to anyone, so it goes through a private file (launch/rank/job_secret.py).
    No servers (collective mode): no ZeroMQ connection to protect, no secret made.
    """
    job_id = base.job_id or world.job_key
    wants = servers > 0 and not (base.secret or base.keys_dir or base.insecure)
    if exchange.trusted:
        # Every rank takes part, whatever it wants: a collective call must be made by all.
        mine = {"job": f"{world.engine}-{uuid.uuid4().hex[:12]}", "secret": new_secret() if wants else None}
        first = exchange.allgather(mine if world.rank == 0 else {})[0]
        job_id = job_id or first["job"]
        if wants != bool(first.get("secret")):
            raise ConfigError(f"{world.describe()}: {'rank 0' if wants else 'this rank'} has PARAMSHARD_SECRET, "
                              f"PARAMSHARD_KEYS_DIR or PARAMSHARD_INSECURE set and {'this rank' if wants else 'rank 0'} "
                              f"has not: give every rank the same (mpirun -x NAME)")
        return job_id, first["secret"] if wants else base.secret, None
    if not job_id:     # the engine names no job: rank 0 names it for everyone
        job_id = exchange.allgather({"job": f"{world.engine}-{uuid.uuid4().hex[:12]}"})[0]["job"]
    if not wants:
        return job_id, base.secret, None
    secret, path, made = shared_secret(environ, job_id)
    return job_id, secret, _SecretFile(path, made)


def _check_same_keys(records: list[dict], secret_file: _SecretFile) -> None:
    """Every rank read the same secret file, or the job stops here with the fix (not later
    with a refused handshake)."""
    keys = [r.get("keys") for r in records]
    others = [r for r in records if r.get("keys") != keys[0]]
    if others:
        where = ", ".join(f"rank {r['rank']} on {r['node']}" for r in others[:8])
        raise ConfigError(f"the ranks read different secrets: {where} did not read what rank 0 on "
                          f"{records[0]['node']} read from {secret_file.path.parent} (not shared between the "
                          f"job's hosts?); {FIX}")
