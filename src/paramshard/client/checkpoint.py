"""Checkpoints from the trainers' side (server side: paramshard.server.services.checkpoint_service).

``save_checkpoint`` asks every server for its state and writes one checkpoint
(paramshard.checkpoint.format): dense parameters whole, one file per parameter
and optimizer slot (the blocks are joined back), sparse tables whole, every row
of every server. ``restore_checkpoint`` cuts them again for the job at hand: its
plan (any number of servers, any dispatch) and its id routing, so a checkpoint
moves between job shapes.

Consistency: in sync mode a checkpoint taken by the chief between two of its
steps is a step boundary on every server: no block or table can complete the
next step without the chief's push, and the tables' snapshots wait until they
completed the chief's last step (sparse pushes are answered before the step
completes). In async mode the servers hold pushes at
one cut while they are read (server/services/push_gate.py); the manifest records it.

Elastic jobs (servers added and removed while they train): a checkpoint and a move's
hand-offs take turns on server 0 (checkpoint/turns.py), so a checkpoint reads either the
routing before the hand-offs or the one after them, never rows half handed over. It asks the
servers that routing names (a server added since this trainer last looked included) and
records it in the manifest; a restore re-partitions the rows by the routing of the job at hand
and places the dense blocks where its block map says, so a checkpoint written by 3 servers
resumes on 2 and the other way round.
"""
from __future__ import annotations

import time
from typing import Mapping

import numpy as np

from paramshard.checkpoint.format import Checkpoint, CheckpointError, CheckpointWriter
from paramshard.checkpoint.turns import checkpoint_turn
from paramshard.errors import ConfigError
from paramshard.mode import Mode
from paramshard.optim import OptimizerConfig, from_wire
from paramshard.placement.partitions import Routing
from paramshard.placement.sharding import ShardPlan
from paramshard.tables import policy_from_wire, policy_to_wire
from paramshard.transport.links import ServerLinks
from paramshard.client import shards
from paramshard.client.sparse import Partition, SparseClient, TableSpec, follow_addresses

SPARSE_PAGE_ROWS = 1 << 20        # rows per snapshot/restore message (~64 MB at dim 16 with Adagrad)


def job_routing(links: ServerLinks) -> Routing:
    """The routing server 0 holds now; servers it names that ``links`` does not know yet are
    connected (as SparseClient.refresh_routing does: the same index for the same server)."""
    wire = links.request(0, {"op": "routing_get"})[0]["routing"]
    if isinstance(wire, dict) and wire.get("partitions") == 0:
        return Routing.initial(0, ("",) * len(links))      # ids by a fixed hash: the servers never change
    routing = Routing.from_wire(wire)
    follow_addresses(links, routing.addresses)       # a retired server ("") may have exited
    return routing


def holders(routing: Routing, links: ServerLinks) -> list[int]:
    """The servers holding the job's state under ``routing``: those owning partitions or dense
    blocks (a server removed by a scale holds nothing, and may be gone); every server of a job
    without virtual partitions."""
    if not routing.elastic:
        return list(range(len(links)))
    named = set(routing.servers()) | set(routing.blocks.values())
    if not routing.blocks:      # no block moved yet: the plan's servers hold them
        named |= set(range(min(len(links), len(routing.addresses))))
    return sorted(s for s in named if s < len(routing.addresses) and routing.addresses[s])


def _gather_dense(links: ServerLinks, plan: ShardPlan, servers=None,
                  routing: Routing | None = None) -> tuple[dict[str, np.ndarray], dict[str, list[np.ndarray]],
                                                           dict[str, int], dict | None, float]:
    """Per parameter: flat values, flat slots, version; the optimizer as the servers hold it and
    the learning-rate scale they apply to it (Trainer.scale_learning_rate). ``routing``: an elastic
    job's; a block is read only from the server its block map names (its old owner keeps a frozen
    copy until the move's end)."""
    servers = links.live() if servers is None else servers
    placed = routing.blocks if routing is not None and routing.elastic else {}
    replies = links.request_many({s: ({"op": "snapshot_dense"}, ()) for s in servers})
    by_name = {b.name: b for b in plan.blocks}
    values = {p.name: np.empty(p.numel, np.float32) for p in plan.params}
    slots: dict[str, list[np.ndarray]] = {}
    versions: dict[str, int] = {}
    seen: set[str] = set()
    optimizer: dict | None = None       # None: no server holds a block (a model without dense parameters)
    scales: set[float] = set()
    for server, (header, arrays) in sorted(replies.items()):
        per_block = 1 + header["slots"]
        if header["blocks"]:
            optimizer = header["optimizer"]
            scales.add(header.get("lr_scale", 1.0))     # a server without blocks has none to apply
        for i, (name, version) in enumerate(zip(header["blocks"], header["versions"])):
            if placed.get(name, server) != server:
                continue
            block = by_name.get(name)
            if block is None:
                raise CheckpointError(f"server {server} holds block {name}, which is not in this model's plan")
            part = arrays[i * per_block:(i + 1) * per_block]
            span = slice(block.offset, block.offset + block.size)
            values[block.param][span] = part[0]
            for j, slot in enumerate(part[1:]):
                slots.setdefault(block.param, [np.empty(len(values[block.param]), np.float32)
                                               for _ in range(per_block - 1)])[j][span] = slot
            versions[block.param] = max(versions.get(block.param, 0), version)
            seen.add(name)
    missing = [n for n in by_name if n not in seen]
    if missing:
        raise CheckpointError(f"the servers do not hold blocks {missing[:3]} (of {len(missing)}): nothing to "
                              f"save before the chief has registered the model")
    if len(scales) > 1:
        raise CheckpointError(f"the servers apply different learning-rate scales to the dense blocks "
                              f"{sorted(scales)}: a learning-rate change reached only some of them")
    return values, slots, versions, optimizer, scales.pop() if scales else 1.0


def gather_table(links: ServerLinks, name: str, min_version: int = 0,
                 only: tuple[str, ...] | None = None, servers=None,
                 routing: Routing | None = None) -> tuple[dict[str, np.ndarray], int, int, float]:
    """Every server's rows of table ``name``, pages joined, once the table has completed
    ``min_version`` steps (sync); its version, evicted count and learning-rate scale. ``only``:
    the parts to keep (e.g. ids and values for a model file: the optimizer's slots are dropped
    page by page). ``servers``: the servers to ask (default all); ``routing``: an elastic job's,
    rows (and admission counters) are kept only from the server owning their partition (an old
    owner keeps the rows it handed away until the move's end drops them)."""
    pieces: dict[str, list[np.ndarray]] = {}
    version = evicted = 0
    scales = set()
    for server in (links.live() if servers is None else servers):     # a server a scale removed holds no rows
        start = 0
        while True:
            (header, arrays), = links.request_list(
                [(server, {"op": "snapshot_sparse", "table": name, "start": start, "count": SPARSE_PAGE_ROWS,
                           "min_version": min_version}, ())])
            page = dict(zip(header["parts"], arrays))
            if routing is not None and routing.elastic:
                page = _owned_part(page, routing, server)
            for part, arr in page.items():
                if only is None or part in only:
                    pieces.setdefault(part, []).append(arr)
            version, evicted = max(version, header["version"]), evicted + header["evicted"]
            scales.add(header.get("lr_scale", 1.0))
            start += SPARSE_PAGE_ROWS
            if start >= header["rows"]:
                break
    if len(scales) > 1:
        raise CheckpointError(f"the servers apply different learning-rate scales to table {name!r} "
                              f"{sorted(scales)}: a learning-rate change reached only some of them")
    scale = scales.pop() if scales else 1.0
    return {part: np.concatenate(arrs) for part, arrs in pieces.items()}, version, evicted, scale


def _owned_part(page: dict, routing: Routing, server: int) -> dict:
    """The rows (and counters) of a snapshot page whose partitions ``server`` owns under ``routing``."""
    mine = routing.servers_of(page["ids"]) == server
    out = {}
    for part, arr in page.items():
        if part in ("counted_ids", "counts"):
            counted = routing.servers_of(page["counted_ids"]) == server
            out[part] = arr[counted]
        else:
            out[part] = arr if mine.all() else arr[mine]
    return out


def _pause_at_a_cut(links: ServerLinks, servers=None) -> dict[int, int]:
    """Async mode: hold pushes everywhere at one cut (server/services/push_gate.py). Returns the cut,
    per trainer the last step every server's state includes."""
    everyone = range(len(links)) if servers is None else servers
    try:
        replies = links.request_many({s: ({"op": "pause_pushes"}, ()) for s in everyone})
        cut: dict[int, int] = {}
        routings: dict[tuple[str, int], int] = {}
        streams = set()
        for header, _ in replies.values():
            for stream, trainer, step in header["applied"]:
                cut[trainer] = max(cut.get(trainer, -1), step)
                streams.add(stream)
            for stream, trainer, version in header.get("routings", ()):
                routings[stream, trainer] = max(routings.get((stream, trainer), -1), version)
                streams.add(stream)
        # A server that joined mid-job waits, per stream, only for the trainers whose pushes of it
        # already route there (an async trainer learns a new routing when one of its requests is
        # refused, maybe mid-step): the others' pushes never come there, and hold none of its rows.
        def skip(server: int) -> list:
            since = replies[server][0].get("since", 0)
            return [[stream, t] for stream in sorted(streams) for t in sorted(cut)
                    if since and routings.get((stream, t), 0) < since]
        links.request_many({s: ({"op": "cut_pushes", "cut": [[t, k] for t, k in sorted(cut.items())],
                                 **({"skip": skip(s)} if skip(s) else {})}, ()) for s in everyone})
    except BaseException:
        links.request_many({s: ({"op": "resume_pushes"}, ()) for s in everyone})
        raise
    return cut


def save_checkpoint(links: ServerLinks, plan: ShardPlan, tables: Mapping[str, TableSpec], root, step: int,
                    settings: Mapping, keep: int | None = None, trainer_id: int = 0) -> tuple:
    """Write the servers' whole state as checkpoint ``step`` under ``root``.
    ``settings``: job facts for the manifest (mode, dispatch, ...). Returns (path, bytes, seconds)."""
    started = time.monotonic()
    writer = CheckpointWriter(root, step)
    cut = None
    try:
        with checkpoint_turn(links, trainer_id):      # no hand-off of a server move meanwhile
            routing = job_routing(links)
            servers = holders(routing, links)
            if settings.get("mode") == Mode.ASYNC:
                cut = _pause_at_a_cut(links, servers)
            try:
                values, slots, versions, optimizer, lr_scale = _gather_dense(links, plan, servers, routing)
                # Sync: the chief's dense reply means every dense block finished this step, but sparse
                # pushes are answered at once: the tables' snapshots wait for the same step.
                min_version = step if settings.get("mode") == Mode.SYNC else 0
                tables_state = {name: gather_table(links, name, min_version, servers=servers, routing=routing)
                                for name in tables}
                # The data-shard queue as of the same cut (client/shards.py): None without dynamic shards.
                shard_state = shards.snapshot(links, settings.get("mode"), settings.get("trainers", 1), step, cut)
            finally:
                if cut is not None:
                    links.request_many({s: ({"op": "resume_pushes"}, ()) for s in servers})
        dense = []
        for i, p in enumerate(plan.params):
            values_file = f"dense/p{i}.values.npy"
            slot_files = [f"dense/p{i}.slot{j}.npy" for j in range(len(slots.get(p.name, [])))]
            writer.put(values_file, values[p.name])
            for slot_file, slot in zip(slot_files, slots.get(p.name, [])):
                writer.put(slot_file, slot)
            dense.append({"name": p.name, "shape": list(p.shape), "version": versions[p.name],
                          "files": {"values": values_file, "slots": slot_files}})
        sparse = []
        for i, (name, spec) in enumerate(tables.items()):
            parts, version, evicted, table_scale = tables_state[name]
            files: dict[str, str] = {}
            for part, arr in parts.items():
                files[part] = f"sparse/t{i}/{part}.npy"
                writer.put(files[part], arr)
            sparse.append({"name": name, "dim": spec.dim, "seed": spec.seed, "init_scale": spec.init_scale,
                           "optimizer": spec.optimizer.to_wire(),
                           "policy": policy_to_wire(spec.admission, spec.eviction, spec.init_scale),
                           "dtype": spec.dtype, "rounding": spec.rounding,     # the files hold float32 either way
                           "rows": int(len(parts["ids"])), "version": version, "evicted": evicted,
                           "lr_scale": table_scale, "files": files})
        if cut is not None:
            settings = {**settings, "cut": {str(t): k for t, k in sorted(cut.items())}}
        if shard_state is not None:
            settings = {**settings, "shards": shard_state}
        if routing.elastic:       # the routing it was taken under (a resume re-partitions by its own)
            settings = {**settings, "routing": routing.to_wire()}
        path = writer.commit({**settings, "servers": len(servers) if routing.elastic else plan.num_servers, "dispatch": plan.dispatch,
                              "optimizer": optimizer, "lr_scale": lr_scale, "plan": plan.to_json(), "dense": dense,
                              "sparse": sparse},
                             keep=keep)
    except BaseException:
        writer.abort()
        raise
    return path, writer.bytes, time.monotonic() - started


def check_fits(ckpt: Checkpoint, plan: ShardPlan, optimizer: OptimizerConfig, tables: Mapping[str, TableSpec]) -> None:
    """The model at hand must be the checkpoint's: same parameters, shapes, optimizer kinds, tables."""
    saved = {d["name"]: d for d in ckpt.manifest["dense"]}
    here = {p.name: list(p.shape) for p in plan.params}
    problems = [f"parameter {n} is {here[n]} here, {saved[n]['shape']} in the checkpoint"
                for n in here if n in saved and saved[n]["shape"] != here[n]]
    problems += [f"parameter {n} is not in the checkpoint" for n in here if n not in saved]
    problems += [f"the checkpoint's parameter {n} is not in this model" for n in saved if n not in here]
    kind = (ckpt.manifest.get("optimizer") or {}).get("kind")
    if kind is not None and kind != optimizer.kind:
        problems.append(f"the dense optimizer is {optimizer.kind} here, {kind} in the checkpoint (its state "
                        f"would not fit)")
    saved_tables = {t["name"]: t for t in ckpt.manifest["sparse"]}
    for name, spec in tables.items():
        t = saved_tables.get(name)
        if t is None:
            problems.append(f"sparse table {name!r} is not in the checkpoint")
        elif t["dim"] != spec.dim or from_wire(t["optimizer"]).kind != spec.optimizer.kind:
            problems.append(f"sparse table {name!r} is dim {spec.dim}/{spec.optimizer.kind} here, "
                            f"dim {t['dim']}/{from_wire(t['optimizer']).kind} in the checkpoint")
        elif row_format_of(t) != (spec.dtype, spec.rounding):
            # A resume continues the run: rows stored (and rounded) as they were.
            saved_dtype, saved_rounding = row_format_of(t)
            problems.append(f"sparse table {name!r} keeps {spec.dtype} rows ({spec.rounding} rounding) here, "
                            f"{saved_dtype} ({saved_rounding}) in the checkpoint")
    if problems:
        raise CheckpointError(f"{ckpt.path} does not fit this model: " + "; ".join(problems))


def restore_checkpoint(links: ServerLinks, plan: ShardPlan, optimizer: OptimizerConfig,
                       tables: Mapping[str, TableSpec], ckpt: Checkpoint, trainer_id: int = 0,
                       routing=None) -> None:
    """Load ``ckpt`` onto this job's fresh servers, cut for ``plan`` (chief only). Tables first:
    the other trainers' first dense pull waits for the dense restore, so they see every table whole."""
    check_fits(ckpt, plan, optimizer, tables)
    with checkpoint_turn(links, trainer_id):      # no hand-off of a server move meanwhile
        if routing is not None and routing.elastic:
            routing = _settle_routing(links, routing)
        _restore(links, plan, optimizer, tables, ckpt, trainer_id, routing)


def _settle_routing(links: ServerLinks, routing: Routing) -> Routing:
    """The job's routing for a restore: the newer of this trainer's and server 0's (a scale may
    have run since this trainer looked; a server 0 restarted in place starts from the job's
    first map), sent to every server it names (``restored``: a server restarted in place owns
    the partitions the routing gives it, not those of the map it started with)."""
    current = job_routing(links)
    if current.version > routing.version:
        routing = current
    follow_addresses(links, routing.addresses)
    named = [s for s, address in enumerate(routing.addresses) if address]
    for header, _ in links.request_many({s: ({"op": "routing_get"}, ()) for s in named}).values():
        theirs = Routing.from_wire(header["routing"])      # one that took the last move's final map
        if theirs.version > routing.version:
            routing = theirs
    links.request_many({s: ({"op": "routing_set", "routing": routing.to_wire(), "restored": True}, ())
                        for s, address in enumerate(routing.addresses) if address})
    return routing


def _restore(links, plan, optimizer, tables, ckpt, trainer_id: int, routing) -> None:
    if "shards" in ckpt.manifest:
        # First: a trainer's first dense pull waits for the dense restore, so none asks for a data
        # task before the queue is the checkpoint's.
        shards.restore(links, ckpt.manifest["shards"])
    sparse_client = SparseClient(links, trainer_id, routing)     # rows go to the servers that own them now
    for entry in ckpt.manifest["sparse"]:
        if entry["name"] not in tables:
            continue
        spec = tables[entry["name"]]
        sparse_client.register_sparse(spec)
        parts = {part: ckpt.array(path) for part, path in entry["files"].items()}
        _restore_table(links, entry, parts, trainer_id, sparse_client.routing)
    _restore_dense(links, plan, optimizer, ckpt, trainer_id, routing)


def _restore_table(links: ServerLinks, entry: dict, parts: dict, trainer_id: int, routing) -> None:
    row_parts = [p for p in parts if p not in ("counted_ids", "counts")]
    ids = parts["ids"]
    route = Partition.of(ids, routing)
    counted_ids = parts.get("counted_ids")
    counted = (counted_ids, Partition.of(counted_ids, routing)) if counted_ids is not None else None
    requests = []
    for server in routing.servers():
        mine = route.part(server)
        chunk_rows = {p: parts[p][mine] for p in row_parts}
        n = len(chunk_rows["ids"])
        for start in range(0, max(n, 1), SPARSE_PAGE_ROWS):
            names = list(row_parts)
            arrays = [chunk_rows[p][start:start + SPARSE_PAGE_ROWS] for p in row_parts]
            if start == 0 and counted is not None:
                counted_rows, count_route = counted
                cm = count_route.part(server)
                names += ["counted_ids", "counts"]
                arrays += [counted_rows[cm], parts["counts"][cm]]
            header = {"op": "restore_sparse", "table": entry["name"], "parts": names,
                      "version": entry["version"], "evicted": 0, "trainer": trainer_id,
                      "lr_scale": float(entry.get("lr_scale", 1.0))}     # none: saved before any change
            if start == 0:
                header["reserve"] = n
            requests.append((server, header, arrays))
    for request in requests:     # one page at a time: bounded memory on the servers' side
        links.request_list([request])


def _restore_dense(links: ServerLinks, plan: ShardPlan, optimizer: OptimizerConfig, ckpt: Checkpoint,
                   trainer_id: int, routing=None) -> None:
    entries = {d["name"]: d for d in ckpt.manifest["dense"]}
    flat = {name: (ckpt.array(d["files"]["values"]).reshape(-1),
                   [ckpt.array(f).reshape(-1) for f in d["files"]["slots"]]) for name, d in entries.items()}
    n_slots = {len(s) for _, s in flat.values()}
    if len(n_slots) > 1:
        raise CheckpointError(f"{ckpt.path}: parameters carry different numbers of optimizer slots")
    slots = n_slots.pop() if n_slots else 0
    requests = []
    moved = routing.blocks if routing is not None and routing.elastic else {}
    placed: dict[int, list] = {}
    for server in range(plan.num_servers):
        for b in plan.for_server(server):      # blocks moved by a scale go where the routing says
            placed.setdefault(moved.get(b.name, server), []).append(b)
    for server, blocks in sorted(placed.items()):
        arrays = []
        for b in blocks:
            values, ss = flat[b.param]
            span = slice(b.offset, b.offset + b.size)
            arrays.append(values[span])
            arrays.extend(s[span] for s in ss)
        requests.append((server, {"op": "restore_dense", "names": [b.name for b in blocks],
                                  "versions": [entries[b.param]["version"] for b in blocks], "slots": slots,
                                  "optimizer": optimizer.to_wire(), "plan_fingerprint": plan.fingerprint(),
                                  "trainer": trainer_id, "lr_scale": float(ckpt.manifest.get("lr_scale", 1.0))},
                         arrays))
    links.request_list(requests)


def row_format_of(entry: dict) -> tuple[str, str]:
    """(dtype, rounding) of a manifest's table entry; a checkpoint from before half rows
    records neither: float32, nearest."""
    return entry.get("dtype", "float32"), entry.get("rounding", "nearest")


def table_spec_from_manifest(entry: dict) -> TableSpec:
    """A table's settings as the checkpoint recorded them."""
    admission, eviction, init_scale = policy_from_wire(entry["policy"])
    dtype, rounding = row_format_of(entry)
    return TableSpec(entry["name"], entry["dim"], from_wire(entry["optimizer"]), entry["seed"], init_scale,
                     admission, eviction, dtype=dtype, rounding=rounding)


def open_for_resume(path, required: bool) -> Checkpoint | None:
    """The checkpoint to resume from; None when it is not readable here and not ``required``
    (a trainer on another host: the chief restores the servers, the servers know the step)."""
    try:
        return Checkpoint(path)
    except (CheckpointError, OSError) as exc:
        if required:
            if isinstance(exc, CheckpointError):
                raise
            raise ConfigError(f"cannot read checkpoint {path}: {exc}") from None
        return None
