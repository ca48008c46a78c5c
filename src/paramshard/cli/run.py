"""`paramshard run --servers S SCRIPT|-m MODULE [ARGS]`: the one command any engine starts on every rank.

Ranks below S serve, the rest train. The rank comes from the engine (see
launch/world.py); servers bind a free port on their own host's address and
every rank learns every server's address through the engine (launch/rendezvous.py).
In collective and hybrid modes the first trainer also binds a port, for the
trainers' torch.distributed store, and hands the listening socket to its script
(PARAMSHARD_COLLECTIVE_FD): nothing can take the port between the exchange and
the store. ``--servers 0`` (collective mode): every rank trains.
Then a server serves until the job ends and a trainer becomes the script, or
``python -m MODULE`` (exec: the engine's signals and exit codes reach it directly).
"""
from __future__ import annotations

import dataclasses
import os
import socket
import sys
import uuid
from pathlib import Path

from ..env import ClusterEnv, check_server_count
from ..errors import ConfigError
from ..launch.api import MALLOC_TUNABLES
from ..launch import target
from ..launch.job_secret import FIX, fingerprint, shared_secret
from ..launch.rendezvous import exchange_for, own_address
from ..launch.world import World, detect
from ..log import configure, get_logger
from ..runtime import build_server, serve
from ..settings.flags import add_flags, contract_changes
from ..transport.security import Security, new_secret

log = get_logger("run")

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
    """`-mMODULE` and `--module=MODULE` become `-m MODULE` (see launch/target.py)."""
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
        _restart_with_malloc_tunables()
    environ = dict(os.environ)
    args.script, args.module, args.args = target.from_args(args.script, args.module, args.args)
    # A module is looked for by python -m on each trainer: a missing one fails it like any error.
    if args.script is not None and not os.path.isfile(args.script):
        raise ConfigError(f"training script {args.script!r} not found (in {os.getcwd()})")
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
    return _run_rank(args, base, world, environ)


def _run_explicit(args, env: ClusterEnv, environ: dict) -> int:
    """PARAMSHARD_ROLE and the addresses are given (Kubernetes, hand-written scripts)."""
    if len(env.servers) != args.servers:
        raise ConfigError(f"--servers {args.servers}, but PARAMSHARD_SERVERS lists {len(env.servers)} "
                          f"addresses: they must agree")
    configure(env.log_tag)
    if env.role == "server":
        code = serve(env)
        if env.server_id == 0:
            _after_job()
        return code
    _become_script(args, env, environ)


def _run_rank(args, base: ClusterEnv, world: World, environ: dict) -> int:
    servers_count = args.servers
    is_server = world.rank < servers_count
    role_name = f"server {world.rank}" if is_server else f"trainer {world.rank - servers_count}"
    configure(f"{role_name}, rank {world.rank} on {world.node}")   # before the rendezvous, which may fail
    exchange, world = exchange_for(world, environ, base.timeout, args.store_port)
    job_id, secret, secret_file = _job_and_secret(base, world, exchange, environ, servers=servers_count)
    common = dataclasses.replace(base, num_trainers=world.size - servers_count, job_id=job_id, secret=secret,
                                 where=f"rank {world.rank} on {world.node}")

    server = store_socket = None
    record = {"rank": world.rank, "node": world.node, "server": None}
    if secret_file is not None:     # ranks that read different files (hosts not sharing it) must not start
        record["keys"] = fingerprint(Security.from_secret(secret, job_id).server_public)
    if base.collective and world.rank == servers_count:
        # The first trainer hosts the trainers' store: bound now, handed to the script.
        host = own_address(world, environ)
        store_socket = socket.create_server((base.bind or host, 0), backlog=1024)
        record["collective"] = f"{host}:{store_socket.getsockname()[1]}"
    if is_server:
        host = own_address(world, environ)
        provisional = dataclasses.replace(common, role="server", server_id=world.rank,
                                          servers=(f"{host}:0",) * servers_count)
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
    addresses = tuple(r["server"] for r in records[:servers_count])
    if base.collective:
        common = dataclasses.replace(common, collective_addr=records[servers_count]["collective"])
    if world.rank == 0:
        log.info("%d servers, %d trainers under %s: %s", servers_count, world.size - servers_count, world.engine,
                 "; ".join(f"{'server' if r['rank'] < servers_count else 'trainer'} "
                           f"{r['rank'] if r['rank'] < servers_count else r['rank'] - servers_count}: "
                           f"rank {r['rank']} on {r['node']}" + (f" at {r['server']}" if r["server"] else "")
                           for r in records))
    if is_server:
        env = dataclasses.replace(common, role="server", server_id=world.rank, servers=addresses)
        server.watch_peers({i: a for i, a in enumerate(addresses) if i != world.rank})
        # So that a lost trainer is named the way the engine names it.
        server.membership.places = {r["rank"] - servers_count: f"rank {r['rank']} on {r['node']}"
                                    for r in records[servers_count:]}
        return serve(env, server)
    # Its host's address: its /metrics listens there, not on every interface.
    env = dataclasses.replace(common, role="trainer", trainer_id=world.rank - servers_count, servers=addresses,
                              host=own_address(world, environ))
    if store_socket is not None:
        os.set_inheritable(store_socket.fileno(), True)     # kept open across the exec
        env = dataclasses.replace(env, collective_fd=store_socket.detach())
    _become_script(args, env, environ)


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
    stores are open to anyone, so it goes through a private file (launch/job_secret.py).
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


def _restart_with_malloc_tunables() -> None:
    """glibc reads its tunables at start-up only: run this command again with the
    settings `paramshard launch` gives its processes (launch/api.py MALLOC_TUNABLES)."""
    env = {**os.environ, "GLIBC_TUNABLES": MALLOC_TUNABLES}
    sys.stdout.flush(), sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "paramshard", *sys.argv[1:]], env)


def _after_job() -> None:
    """On Kubernetes, server pods would be restarted after the job: remove them."""
    try:
        from ..launch.k8s_cleanup import delete_job_objects
    except ImportError:
        return
    delete_job_objects()


def _become_script(args, env: ClusterEnv, environ: dict) -> None:
    """Replace this process with ``python SCRIPT ARGS`` (or ``python -m MODULE ARGS``) and the job's contract."""
    child_env = {**environ, **env.to_environ(), "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, *target.command_words(args.script, args.module, args.args)]
    from ..observe.rank_records import run_dir_of, write_rank
    if run_dir_of(env) is not None:
        write_rank(run_dir_of(env), env.rank_name, env)
    sys.stdout.flush(), sys.stderr.flush()
    os.execve(sys.executable, argv, child_env)
