"""The job's contract: settings every rank reads into ``ClusterEnv`` (scope JOB).

Declaration order is the order of ClusterEnv's fields and of docs/environment.md.
Error messages name the variable; the flags' messages name the flag.
"""
from __future__ import annotations

import uuid
from typing import Mapping

from paramshard.errors import ConfigError
from paramshard.limits import SPEC as LIMIT_SPEC, Limits
from paramshard.mode import MODES, Mode
from paramshard.settings import argtypes
from paramshard.settings.setting import JOB, K8S, LAUNCH, Setting, flag

MODE_NAMES = tuple(m.value for m in MODES)      # argparse shows its choices with repr(): plain strings

ROLES = ("server", "trainer")
COLLECTIVE_BACKENDS = ("gloo", "nccl")
DISPATCHERS = ("round_robin", "hash", "legacy_v1", "balanced")
DEFAULT_MIN_BLOCK_SIZE = 8192
DEFAULT_TIMEOUT = 120.0
CHECKPOINTS, WATCH = "checkpoints", "seeing the job"     # `paramshard launch`'s argument groups
SECRET_SOURCE = "secret source"     # `paramshard k8s`'s mutually exclusive group (made by cli/jobs/k8s.py)
_LAUNCHED = frozenset({JOB, LAUNCH})


def new_job_id() -> str:
    """A launcher's job id when none is given: names the job in its CurveZMQ keys."""
    return f"job-{uuid.uuid4().hex[:12]}"


def first_int(e: Mapping[str, str], *names: str) -> int | None:
    """The first of ``names`` set in ``e``, as a whole number."""
    for name in names:
        if e.get(name, "") != "":
            try:
                return int(e[name])
            except ValueError:
                raise ConfigError(f"{name}={e[name]!r} is not a whole number") from None
    return None


def _role(e: Mapping[str, str]) -> str | None:
    for name in ("PARAMSHARD_ROLE", "PADDLE_TRAINING_ROLE", "TRAINING_ROLE"):
        if e.get(name, "") != "":
            value = e[name].strip().lower()
            value = {"pserver": "server"}.get(value, value)
            if value not in ROLES:
                raise ConfigError(f"{name}={e[name]!r}: expected server or trainer (PSERVER/TRAINER)")
            return value
    return None


def _servers(e: Mapping[str, str]) -> tuple[str, ...]:
    for name in ("PARAMSHARD_SERVERS", "PADDLE_PSERVERS_IP_PORT_LIST"):
        if e.get(name, "") != "":
            return tuple(s.strip() for s in e[name].split(",") if s.strip())
    if e.get("PADDLE_INIT_PSERVERS", "") == "":
        return ()
    port = e.get("PADDLE_INIT_PORT")
    hosts = [s.strip() for s in e["PADDLE_INIT_PSERVERS"].split(",") if s.strip()]
    return tuple(hosts if port is None else [h if ":" in h else f"{h}:{port}" for h in hosts])


def _server_id(e: Mapping[str, str]) -> int | None:
    found = first_int(e, "PARAMSHARD_SERVER_ID", "PADDLE_PSERVER_ID")
    servers = _servers(e)
    if found is None and e.get("PADDLE_CURRENT_ENDPOINT") in servers:
        return servers.index(e["PADDLE_CURRENT_ENDPOINT"])
    return found


def check_address(what: str, addr: str) -> str | None:
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        return f"{what} {addr!r} is not host:port"
    return None


def _first_bad_address(addresses) -> str | None:
    return next((m for a in addresses if (m := check_address("PARAMSHARD_SERVERS entry", a))), None)


def _yes_no(text: str) -> bool:
    value = text.strip().lower()
    if value in ("", "0", "no", "false"):
        return False
    if value in ("1", "yes", "true"):
        return True
    raise ValueError(text)


GEO_SENDS = ("overlapped", "blocking")       # trainer/backends/geo.py: how a round goes out
RECOVERIES = ("rollback", "bounded-loss")   # launch/elastic/replica_keeper.py: bounded-loss
ROW_STORES = ("compiled", "numpy")     # server/storage/row_stores.py STORES


def _budget(value, what: str):
    from paramshard.budgets import parse_budget
    if isinstance(value, str):
        value = value.strip() or None
    return parse_budget(value, what)


def size(text: str) -> int:
    """argparse's type for a memory size ("4GB", "512MiB"); its name is argparse's word for a bad one."""
    return _budget(text, "--memory-budget")


def _int_at_least(variable: str, minimum: int, unit: str):
    return lambda v: f"{variable}={v}: must be >= {minimum}{unit}" if v is not None and v < minimum else None


def _geo_k(text) -> int | str | None:
    """``--geo-k``: a whole number >= 1 or ``auto``."""
    if text is None or isinstance(text, int) and not isinstance(text, bool):
        k = text
    else:
        text = str(text).strip().lower()
        if not text:
            return None
        if text == "auto":
            return "auto"
        try:
            k = int(text)
        except ValueError:
            raise ConfigError(f"PARAMSHARD_GEO_K={text!r} (--geo-k): expected a whole number of steps >= 1, "
                              f"or auto") from None
    if k is not None and k < 1:
        raise ConfigError(f"PARAMSHARD_GEO_K={k} (--geo-k): k counts local steps between two sends, at least 1")
    return k


def _geo_k_flag(text: str) -> int | str | None:
    """``--geo-k``'s argparse type: the setting's message alone, as argparse's own errors."""
    try:
        return _geo_k(text)
    except ConfigError as exc:
        raise argtypes.flag_error(str(exc)) from None


def _limit_rows() -> list[tuple[str, str, str]]:
    return [(variable, f"{meaning} (default {default})", "") for variable, default, meaning in LIMIT_SPEC.values()]


def _limits(e: Mapping[str, str]) -> Limits:
    return Limits(**{field: value for field, (variable, _, _) in LIMIT_SPEC.items()
                     if (value := first_int(e, variable)) is not None})


_MODE_HELP = ("sync: barrier per step; async: apply on arrival; geo: local steps, a send every --geo-k; "
              "collective: no servers, dense gradients averaged by allreduce")

CONTRACT: tuple[Setting, ...] = (
    Setting("PARAMSHARD_ROLE", "`server` or `trainer`; unset means a standalone run (a local server is started "
            "in-process)", "role", annotation="str | None", reader=_role, required=True,
            fallbacks=("PADDLE_TRAINING_ROLE", "TRAINING_ROLE"),
            check=lambda v: f"PARAMSHARD_ROLE={v!r}: expected one of {ROLES}" if v is not None and v not in ROLES
            else None),
    Setting("PARAMSHARD_SERVERS", "comma-separated `host:port` of all servers", "servers", (),
            "tuple[str, ...]", reader=_servers, text=",".join, always=True, check=_first_bad_address,
            fallbacks=("PADDLE_PSERVERS_IP_PORT_LIST", "PADDLE_INIT_PSERVERS (+PADDLE_INIT_PORT)")),
    Setting("PARAMSHARD_SERVER_ID", "this server's index (servers only)", "server_id", None, "int | None",
            reader=_server_id, written_when=lambda env: env.role == "server",
            fallbacks=("PADDLE_PSERVER_ID", "PADDLE_CURRENT_ENDPOINT (looked up in the server list)")),
    Setting("PARAMSHARD_TRAINERS", "number of trainers", "num_trainers", 1, "int", int, always=True,
            fallbacks=("PADDLE_TRAINERS_NUM", "PADDLE_INIT_NUM_GRADIENT_SERVERS"),
            check=_int_at_least("PARAMSHARD_TRAINERS", 1, ""), scopes=frozenset({JOB, LAUNCH, K8S}),
            launch_field="trainers",
            flags=(flag("launch", "--trainers", "number of trainers (default 1), or MIN:MAX: an elastic job of MAX "
                        "trainers that goes on with at least MIN (`paramshard scale`)", type=argtypes.trainers,
                        default=1, metavar="N|MIN:MAX"),
                   flag("k8s", "--trainers", "number of trainers (an Indexed Job)", type=argtypes.count("--trainers"),
                        required=True, metavar="M"))),
    Setting("PARAMSHARD_TRAINER_ID", "this trainer's index, 0..T-1", "trainer_id", 0, "int", int,
            written_when=lambda env: env.role == "trainer",
            fallbacks=("PADDLE_TRAINER_ID", "PADDLE_INIT_TRAINER_ID")),
    Setting("PARAMSHARD_MODE", "`sync` (barrier per step, default), `async`, `collective` (no servers: dense "
            "gradients averaged by allreduce, torch DistributedDataParallel), `hybrid` (dense by allreduce, "
            "sparse tables on the servers, sync steps) or `geo` (local replicas, a send every PARAMSHARD_GEO_K "
            "steps)", "mode", Mode.SYNC, "Mode", Mode.parse, keep_empty=True,
            coerce=Mode.parse, always=True, scopes=frozenset({JOB, LAUNCH, K8S}),
            flags=(flag("launch", "--mode", _MODE_HELP + " (DDP); hybrid: dense by allreduce, sparse tables on the "
                        "servers (docs/modes.md)", choices=MODE_NAMES, default="sync"),
                   flag("k8s", "--mode", _MODE_HELP + " among the trainers; hybrid: dense by allreduce, sparse "
                        "tables on the servers", choices=MODE_NAMES, default="sync"),
                   flag("run", "--mode", "sync or async (default: PARAMSHARD_MODE, else sync)", choices=MODE_NAMES))),
    Setting("PARAMSHARD_COLLECTIVE_ADDR", "collective and hybrid modes: `host:port` where trainer 0 hosts the "
            "torch.distributed store the trainers meet at (the launcher picks it)", "collective_addr",
            check=lambda v: v is not None and check_address("PARAMSHARD_COLLECTIVE_ADDR", v) or None),
    Setting("PARAMSHARD_COLLECTIVE_BACKEND", "collective and hybrid modes: torch.distributed backend, `gloo` "
            "(default; CPU tensors) or `nccl`", "collective_backend", "gloo", "str", scopes=_LAUNCHED, inherit=True,
            check=lambda v: f"PARAMSHARD_COLLECTIVE_BACKEND={v!r}: expected one of {COLLECTIVE_BACKENDS}"
            if v not in COLLECTIVE_BACKENDS else None),
    Setting("PARAMSHARD_COLLECTIVE_FD", "set by `paramshard run` on trainer 0: a listening socket for that store, "
            "bound before the address exchange", "collective_fd", None, "int | None", int),
    Setting("PARAMSHARD_DISPATCH", "block placement: " + ", ".join(DISPATCHERS) + " (default round_robin)",
            "dispatch", "round_robin", "str", keep_empty=True, always=True, scopes=_LAUNCHED,
            check=lambda v: f"PARAMSHARD_DISPATCH={v!r}: expected one of {DISPATCHERS}" if v not in DISPATCHERS
            else None,
            flags=(flag("launch", "--dispatch", "how blocks go to servers", choices=DISPATCHERS,
                        default="round_robin"),)),
    Setting("PARAMSHARD_MIN_BLOCK_SIZE", f"smallest dense block in elements (default {DEFAULT_MIN_BLOCK_SIZE})",
            "min_block_size", DEFAULT_MIN_BLOCK_SIZE, "int", int, always=True, scopes=_LAUNCHED,
            check=_int_at_least("PARAMSHARD_MIN_BLOCK_SIZE", 1, ""),
            flags=(flag("launch", "--min-block-size", f"smallest dense block, in elements (default "
                        f"{DEFAULT_MIN_BLOCK_SIZE})", type=argtypes.positive("--min-block-size", int, "a whole number"),
                        default=DEFAULT_MIN_BLOCK_SIZE),)),
    Setting("PARAMSHARD_TIMEOUT", f"seconds any single wait may take (default {DEFAULT_TIMEOUT:g})", "timeout",
            DEFAULT_TIMEOUT, "float", float, " is not a number", text=repr, always=True,
            check=lambda v: f"PARAMSHARD_TIMEOUT={v}: must be > 0 seconds" if v <= 0 else None,
            scopes=frozenset({JOB, LAUNCH, K8S}),
            flags=(flag("launch", "--timeout", f"seconds any single wait may take (default {DEFAULT_TIMEOUT:g})",
                        type=argtypes.positive("--timeout", float, "a number of seconds"), default=DEFAULT_TIMEOUT),
                   flag("k8s", "--timeout", f"seconds any single wait may take, PARAMSHARD_TIMEOUT (default "
                        f"{DEFAULT_TIMEOUT:g}); trainers wait this long for servers still being scheduled",
                        type=argtypes.seconds("--timeout"), default=DEFAULT_TIMEOUT),
                   flag("run", "--timeout", "deadline of any single wait, the rendezvous included (default: "
                        "PARAMSHARD_TIMEOUT, else 120)", type=float, metavar="SECONDS"))),
    Setting("PARAMSHARD_IDLE_EXIT", "servers: seconds a server waits for its job, counted from its start and from each "
            "`hello` since; past them, with no other request ever (a trainer's, a launcher's move, a restore), it "
            "exits with code 1 naming what it waited for (`paramshard server --idle-exit`; 0: wait "
            "for ever; default: PARAMSHARD_TIMEOUT, at least 60)", "idle_exit", None, "float | None", float,
            " is not a number", check=lambda v: f"PARAMSHARD_IDLE_EXIT={v}: must be >= 0 seconds (0: wait for ever)"
            if v is not None and not v >= 0 else None),
    Setting("PARAMSHARD_BIND", "address a server binds to (default: the host of its own entry in "
            "PARAMSHARD_SERVERS)", "bind"),
    Setting("PARAMSHARD_SECRET", "shared secret: every connection is encrypted and authenticated with CurveZMQ, "
            "keys derived from it and the job id. Unset, `paramshard launch` and `paramshard run` make a random one "
            "per job (docs/security.md); the launcher passes it on", "secret", scopes=_LAUNCHED, inherit=True,
            hidden=True),
    Setting("PARAMSHARD_INSECURE", "`1`: no secret is made, connections are plain TCP (`launch --insecure`, "
            "`run --insecure`); refused together with PARAMSHARD_SECRET or PARAMSHARD_KEYS_DIR", "insecure", False,
            "bool", _yes_no, ": expected 1 (yes) or 0 (no)", text=lambda v: "1",
            scopes=frozenset({JOB, LAUNCH, K8S}), inherit=True,
            flags=(flag("launch", "--insecure", "plain TCP between the processes (also PARAMSHARD_INSECURE=1); by "
                        "default the job gets a random secret and every connection is CurveZMQ (docs/security.md)", action="store_true"),
                   flag("run", "--insecure", "plain TCP between the ranks (also PARAMSHARD_INSECURE=1); by default "
                        "they share a random secret and every connection is CurveZMQ (docs/security.md)",
                        action="store_true"),
                   flag("k8s", "--insecure", "no secret at all: connections to the servers are plain, "
                        "unauthenticated TCP and the pods get PARAMSHARD_INSECURE=1; only for a network no one "
                        "else reaches", SECRET_SOURCE, action="store_true"))),
    Setting("PARAMSHARD_JOB_ID", "name of this job, the same on every process; mixed into the keys so two jobs "
            "with one secret never accept each other's traffic (the launcher makes one)", "job_id", "", "str",
            keep_empty=True, scopes=_LAUNCHED, inherit=True, launch_factory=new_job_id),
    Setting("PARAMSHARD_KEYS_DIR", "CurveZMQ key files instead of a secret (docs/security.md)",
            "keys_dir", scopes=_LAUNCHED, inherit=True),
    Setting("PARAMSHARD_WHERE", "where this process runs, for its log lines (`paramshard run` sets e.g. "
            "`rank 3 on node7`)", "where", "", "str", keep_empty=True),
    Setting("PARAMSHARD_HOST", "the address other hosts reach this host at; a server started by `paramshard run` "
            "advertises it (default: the address on the route towards the engine's rendezvous host), a trainer "
            "serves its /metrics there (`launch --hosts` and `paramshard run` set it)", "host",
            parse=lambda text: text.strip() or None),
    Setting("PARAMSHARD_CHECKPOINT_DIR", "where checkpoints go (`launch --checkpoint-dir`); trainers save there "
            "every PARAMSHARD_CHECKPOINT_EVERY steps and when they finish", "checkpoint_dir", scopes=_LAUNCHED,
            flags=(flag("launch", "--checkpoint-dir", "save checkpoints here: every --checkpoint-every steps and "
                        "when the job ends", CHECKPOINTS, metavar="DIR"),)),
    Setting("PARAMSHARD_CHECKPOINT_EVERY", "steps between checkpoints (0: only the final one)", "checkpoint_every",
            0, "int", int, written_when=lambda env: bool(env.checkpoint_dir), scopes=_LAUNCHED,
            check=_int_at_least("PARAMSHARD_CHECKPOINT_EVERY", 0, " steps"),
            flags=(flag("launch", "--checkpoint-every", "steps between checkpoints (without it: only the final "
                        "checkpoint)", CHECKPOINTS, metavar="STEPS",
                        type=argtypes.positive("--checkpoint-every", int, "a whole number")),)),
    Setting("PARAMSHARD_CHECKPOINT_KEEP", "how many checkpoints to keep (default 3)", "checkpoint_keep", 3, "int",
            int, written_when=lambda env: bool(env.checkpoint_dir), scopes=_LAUNCHED,
            check=lambda v: f"PARAMSHARD_CHECKPOINT_KEEP={v}: keep at least 1" if v < 1 else None,
            flags=(flag("launch", "--keep", "checkpoints to keep, the newest (default 3)", CHECKPOINTS, metavar="N",
                        type=argtypes.positive("--keep", int, "a whole number"), default=3),)),
    Setting("PARAMSHARD_RESUME", "a checkpoint (a step-N directory, or a checkpoint directory for its latest) "
            "the job starts from (`launch --resume`)", "resume", scopes=_LAUNCHED,
            flags=(flag("launch", "--resume", "start from a checkpoint: DIR (a step-N directory, or a checkpoint "
                        "directory's latest); alone: the latest in --checkpoint-dir", CHECKPOINTS, metavar="DIR",
                        nargs="?", const=""),)),
    Setting("PARAMSHARD_MIN_TRAINERS", "set: an elastic job (`launch --trainers MIN:MAX` or async "
            "`--min-trainers MIN`): trainer slots 0..PARAMSHARD_TRAINERS-1 may be empty, a lost trainer is no longer "
            "waited for, a process may join a slot mid-job; servers end normally once every trainer has ended, if "
            "at least MIN left normally", "min_trainers", None,
            "int | None", int, scopes=_LAUNCHED,
            flags=(flag("launch", "--min-trainers", "a trainer that dies does not stop the job while N trainers "
                        "are alive (an elastic job, like --trainers N:MAX; default: any failure stops the job)",
                        metavar="N", type=argtypes.positive("--min-trainers", int, "a whole number")),)),
    Setting("PARAMSHARD_JOINING", "set by the launcher on a trainer it starts mid-job in an elastic job (a "
            "replacement, a scale-up): it joins (client/control.join) instead of starting with the job",
            "joining", False, "bool", lambda text: text != "0", text=lambda v: "1"),
    Setting("PARAMSHARD_MAX_IN_FLIGHT", "async: pushes a trainer may have on their way before it waits for the "
            "oldest reply (default 1; 0 waits for every push; sync mode always waits)", "max_in_flight", None,
            "int | None", int, check=_int_at_least("PARAMSHARD_MAX_IN_FLIGHT", 0, " pushes")),
    Setting("PARAMSHARD_MAX_RESTARTS", "how many times the launcher may restart a dead server in place "
            "(`launch --max-restarts`); trainers then wait for it and roll back to the latest checkpoint",
            "max_restarts", 0, "int", int, scopes=_LAUNCHED,
            flags=(flag("launch", "--max-restarts", "when a process dies, restart the job up to N times from the "
                        "latest checkpoint in --checkpoint-dir (every server and trainer rolls back to it; default "
                        "0: fail)", CHECKPOINTS, metavar="N", type=int, default=0),)),
    Setting("PARAMSHARD_RECOVERING", "set by the launcher on a server it restarted: serve nothing until the chief "
            "restores the checkpoint", "recovering", False, "bool", lambda text: text != "0", text=lambda v: "1"),
    Setting("PARAMSHARD_RECOVERY", "what a server restarted in place (`--max-restarts`) comes back with: `rollback` "
            "(every trainer rolls back to the latest checkpoint) or `bounded-loss` (async and geo modes: the launcher keeps a "
            "replica of every server, refreshed every 0.25 s, restores it onto the replacement, and the trainers "
            "retry what failed; at most the last refresh period of updates is lost: docs/fault-tolerance.md)",
            "recovery", "rollback", "str", lambda text: text.strip().lower(), scopes=_LAUNCHED,
            check=lambda v: f"PARAMSHARD_RECOVERY={v!r}: expected one of {RECOVERIES}" if v not in RECOVERIES else None,
            flags=(flag("launch", "--recovery", "how a server restarted in place comes back: rollback (default: every "
                        "trainer rolls back to the latest checkpoint) or bounded-loss (async, geo: restored from the "
                        "launcher's replica, at most ~0.25 s of updates lost, no rollback)", CHECKPOINTS,
                        choices=RECOVERIES),)),
    Setting("PARAMSHARD_METRICS_PORT", "base port of the Prometheus `/metrics` endpoints: server i listens on "
            "PORT+i, trainer j on PORT+servers+j (0 or unset: none)", "metrics_port", 0, "int", int, scopes=_LAUNCHED,
            check=lambda v: f"PARAMSHARD_METRICS_PORT={v}: must be a port, 1..65535 (0: off)"
            if not 0 <= v <= 65535 else None,
            flags=(flag("launch", "--metrics-port", "serve Prometheus /metrics: server i on PORT+i, trainer j on "
                        "PORT+servers+j", WATCH, metavar="PORT", type=int, default=0),)),
    Setting("PARAMSHARD_MAX_STALENESS", "async mode: a trainer may start step j only when every trainer finished "
            "step j-K-1 (bounded staleness, SSP); geo mode: the most local steps between two sends (k never "
            "exceeds it; unset: 1024); unset: no bound", "max_staleness", None, "int | None", int,
            scopes=_LAUNCHED, check=_int_at_least("PARAMSHARD_MAX_STALENESS", 0, " steps"),
            flags=(flag("launch", "--max-staleness", "async: a trainer waits while it is more than K steps ahead of "
                        "the slowest (bounded staleness); 0 is lockstep", metavar="K", type=int),)),
    Setting("PARAMSHARD_GEO_K", "geo mode: local steps a trainer trains between two sends of its change, a "
            "whole number >= 1, or `auto` (chosen and adapted while it trains: geo/auto_k.py); never more than "
            "PARAMSHARD_MAX_STALENESS; unset: 10 (docs/modes.md)", "geo_k", None, "int | str | None", _geo_k,
            scopes=_LAUNCHED,
            flags=(flag("launch", "--geo-k", "geo mode: local steps between two sends of a trainer's change "
                        "(default 10), or auto; at most --max-staleness", metavar="K|auto", type=_geo_k_flag),)),
    Setting("PARAMSHARD_GEO_SEND", "geo mode: how a trainer sends a round, `overlapped` (the default: it trains "
            "the next round while the round is on the wire, and the merge lands at the first step boundary after "
            "it is back; the steps trained meanwhile go out with the next round) or `blocking` (it waits for each "
            "round's merge; one trainer's run is then deterministic: docs/modes.md)", "geo_send", "overlapped",
            "str", lambda text: text.strip().lower(), scopes=_LAUNCHED,
            check=lambda v: f"PARAMSHARD_GEO_SEND={v!r} (--geo-send): expected one of {GEO_SENDS}"
            if v not in GEO_SENDS else None,
            flags=(flag("launch", "--geo-send", "geo mode: overlapped (default: the next round trains while a "
                        "round is on the wire) or blocking (wait for each round's merge)", choices=GEO_SENDS),)),
    Setting("PARAMSHARD_PARTITIONS", "sparse ids are routed by this many virtual partitions (a power of two, "
            ">= 64 x the most servers the job will have), so servers can be added and removed while it trains "
            "(placement/partitions.py); 0, the default: fixed routing by id hash, the server count never changes",
            "partitions", 0, "int", int, scopes=_LAUNCHED, inherit=True,
            check=lambda v: None if v == 0 or (2 <= v <= 1 << 20 and v & (v - 1) == 0) else
            f"PARAMSHARD_PARTITIONS={v}: expected 0 (fixed routing) or a power of two from 2 to 1048576",
            flags=(flag("launch", "--partitions", "route sparse ids by P virtual partitions (a power of two, e.g. "
                        "1024) so `paramshard scale RUN_DIR --servers N` can add and remove servers while the job "
                        "trains; default 0: fixed routing", metavar="P", type=int),)),
    Setting("PARAMSHARD_ROW_STORE", "servers: what holds sparse table rows, `compiled` (numba kernels, the "
            "default) or `numpy` (the reference implementation: the same tables bit for bit, slower); the launcher "
            "passes its own value on", "row_store", "compiled", "str", lambda text: text.strip().lower(),
            scopes=_LAUNCHED, inherit=True,
            check=lambda v: f"PARAMSHARD_ROW_STORE={v!r}: expected one of {ROW_STORES}" if v not in ROW_STORES else None,
            flags=(flag("launch", "--row-store", "what holds the servers' sparse rows: compiled (default) or numpy "
                        "(the reference; same tables, slower)", choices=ROW_STORES),)),
    Setting("PARAMSHARD_MEMORY_BUDGET", "servers: RAM each server process may hold, like `4GB`, `512MiB` or bytes "
            "(`launch --memory-budget`, `paramshard server --memory-budget`): every sparse table of the server keeps "
            "its rows in a file tier (under the `paramshard run --run-dir` directory, else the checkpoint directory, "
            "else a temporary one) and only the most used in RAM; unset: every row in RAM. A table's own budget: SparseEmbedding(memory_budget=)",
            "memory_budget", None, "int | None", lambda text: _budget(text, "PARAMSHARD_MEMORY_BUDGET"),
            invalid=" is not a size", scopes=_LAUNCHED, coerce=lambda v: _budget(v, "memory_budget"),
            flags=(flag("launch", "--memory-budget", "RAM each server may hold, like 4GB or 512MiB: sparse rows live "
                        "in a file tier (under --checkpoint-dir, else a temporary directory), the most used in RAM "
                        "(default: every row in RAM)", metavar="SIZE", type=size),)),
    # Deltas (online learning, issue 33; server/services/delta_service.py): what servers publish while the job trains.
    Setting("PARAMSHARD_DELTA_DIR", "servers publish the rows and dense blocks they changed there while the job "
            "trains, every PARAMSHARD_DELTA_SECONDS or PARAMSHARD_DELTA_UPDATES, with a full snapshot every "
            "PARAMSHARD_DELTA_SNAPSHOT_EVERY deltas; the chief trainer writes model.pt and blocks.json there when "
            "it starts (`launch --deltas`; docs/serving.md, layout: online/delta_log.py); unset: nothing published",
            "delta_dir", scopes=_LAUNCHED, inherit=True,
            flags=(flag("launch", "--deltas", "servers publish deltas and snapshots of the model into DIR while the "
                        "job trains (docs/serving.md)", metavar="DIR"),)),
    Setting("PARAMSHARD_DELTA_SECONDS", "seconds between two deltas of a server (default 2; with "
            "PARAMSHARD_DELTA_DIR)", "delta_seconds", 2.0, "float", float, " is not a number", scopes=_LAUNCHED,
            inherit=True, check=lambda v: f"PARAMSHARD_DELTA_SECONDS={v}: must be > 0 seconds" if not v > 0 else None),
    Setting("PARAMSHARD_DELTA_UPDATES", "a server publishes a delta after this many pushes too, if sooner than "
            "PARAMSHARD_DELTA_SECONDS (default 0: by time only)", "delta_updates", 0, "int", int, scopes=_LAUNCHED,
            inherit=True, check=_int_at_least("PARAMSHARD_DELTA_UPDATES", 0, " pushes")),
    Setting("PARAMSHARD_DELTA_SNAPSHOT_EVERY", "a server publishes a full snapshot every this many deltas (default "
            "50)", "delta_snapshot_every", 50, "int", int, scopes=_LAUNCHED, inherit=True,
            check=_int_at_least("PARAMSHARD_DELTA_SNAPSHOT_EVERY", 1, " deltas")),
    Setting("PARAMSHARD_DELTA_FP16", "`1`: rows in deltas and snapshots are float16 (the float32 values rounded to "
            "nearest), half the bytes; dense blocks stay float32", "delta_fp16", False, "bool", _yes_no,
            ": expected 1 (yes) or 0 (no)", text=lambda v: "1", scopes=_LAUNCHED, inherit=True),
    Setting("PARAMSHARD_DELTA_DENSE_THRESHOLD", "a dense block is in a delta when its values moved more than this "
            "relative L2 change since it was last published (default 0: any change)", "delta_dense_threshold", 0.0,
            "float", float, " is not a number", scopes=_LAUNCHED, inherit=True,
            check=lambda v: f"PARAMSHARD_DELTA_DENSE_THRESHOLD={v}: must be >= 0" if not v >= 0 else None),
    Setting("PARAMSHARD_RECORDS", "`stdout`: trainers print progress records for the launcher's run directory "
            "(set by `paramshard launch`); `dir:PATH`: every rank writes its own into PATH (`paramshard run "
            "--run-dir`)", "records", scopes=_LAUNCHED,
            check=lambda v: f"PARAMSHARD_RECORDS={v!r}: 'stdout' or 'dir:PATH'"
            if v is not None and v != "stdout" and not v.startswith("dir:") else None),
    Setting("PARAMSHARD_MAX_MESSAGE_BYTES", "the server's resource limits, one variable each (limits.py)",
            "limits", Limits(), "Limits", reader=_limits, writer=lambda limits: limits.to_environ(),
            scopes=_LAUNCHED, inherit=True, doc_rows=_limit_rows),
)
