"""The checkpoint Service: a server's whole state out (snapshot) and back in (restore).

Client side: paramshard.client.checkpoint, which writes the files. The server
never touches a file system: a checkpoint is written where the chief runs,
whatever hosts the servers are on, and can be restored onto any number of
servers. Every array travels with a name in the header's ``parts`` list, so
the message says what it carries.

- ``snapshot_dense``: every block of this server with its optimizer slots and version.
- ``snapshot_sparse``: one page of a table's rows (ids, values, slots, per-row step
  counts and last-seen versions), and on the first page the admission counters.
- ``restore_dense`` / ``restore_sparse``: the chief only, onto servers that hold
  nothing of it yet; all or nothing like registration.
- ``pause_pushes`` / ``cut_pushes`` / ``resume_pushes``: the consistent cut of an
  async checkpoint (server/services/push_gate.py), whose gate this service owns and declares
  as a request hook.
- ``exclude_begin`` / ``exclude_end`` (server 0): a checkpoint and a move's hand-off phase
  take turns (server/elastic/move_exclusion.py).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from typing import TYPE_CHECKING, Callable


from paramshard.errors import ConfigError
from paramshard.optim import check_lr_scale, from_wire, scaled
from paramshard.server.core.context import ServerContext
from paramshard.server.storage.dense_store import DenseStore
from paramshard.server.elastic.move_exclusion import MoveExclusion
from paramshard.server.storage.snapshot_reads import DropGuard, SnapshotReads
from paramshard.server.services.push_gate import PushGate, PushGateHook
from paramshard.server.core.replies import Deferred, Reply
from paramshard.server.services.sparse_service import SparseService
from paramshard.server.storage.sparse_table import SparseTable


class CheckpointService:
    def __init__(self, dense: DenseStore, sparse: SparseService | None, context: ServerContext):
        self.dense = dense
        self.sparse = sparse
        self.gate = PushGate(context.timeout)       # async checkpoints: holds pushes for a consistent cut
        self._gate_hook = PushGateHook(self.gate, context)
        self.ctx = context
        self.turns = MoveExclusion()               # server 0's: checkpoints and moves take turns
        self.reads = SnapshotReads(context.timeout)  # a move's drop waits for a table read in pages
        self._drop_guard = DropGuard(self.reads, context)

    def hooks(self) -> list:
        return [self._gate_hook, self._drop_guard]

    def ops(self) -> dict:
        return {op: getattr(self, f"handle_{op}") for op in
                ("snapshot_dense", "snapshot_sparse", "restore_dense", "restore_sparse",
                 "pause_pushes", "cut_pushes", "resume_pushes", "exclude_begin", "exclude_end")}

    # -- checkpoints and moves take turns (server 0; server/elastic/move_exclusion.py) ---------------
    def handle_exclude_begin(self, header: dict, arrays: list) -> Reply | Deferred:
        who, trainer, after = header["who"], header.get("trainer"), header.get("after_step")
        turns = self.turns
        if self.ctx.server_id != 0:
            raise ConfigError(f"exclude_begin: server 0 keeps the turns of checkpoints and moves, not server "
                              f"{self.ctx.server_id}")
        if who == "checkpoint":
            if trainer is None:
                raise ConfigError("exclude_begin: a checkpoint's turn names its trainer")
            ready: Callable[[], bool] = lambda: turns.checkpoint_may_begin(trainer)   # noqa: E731
            begin: Callable[[], None] = lambda: turns.begin_checkpoint(trainer)     # noqa: E731
        else:
            ready = lambda: turns.move_may_begin(self._completed, after)             # noqa: E731
            begin = turns.begin_move

        def take() -> Reply:
            begin()
            return Reply()

        if ready():
            return take()
        return Deferred(ready=ready, make_reply=take,
                        describe=lambda: f"the {who}'s turn: {turns.holder()} is in progress"
                                         + (f" or step {after - 1} is not complete" if after is not None else ""))

    def handle_exclude_end(self, header: dict, arrays: list) -> Reply:
        self.turns.end(header["who"], header.get("trainer"))
        return Reply()

    def _completed(self, step: int) -> bool:
        """Sync: every table and dense block of this server completed the steps before ``step``."""
        tables = self.sparse.tables.values() if self.sparse else ()
        return all(t.version >= step for t in tables) and all(b.version >= step for b in self.dense.blocks.values())

    # -- the async cut (server/services/push_gate.py) ---------------------------------
    def _streams(self) -> list[str]:
        streams = ["dense"] if self.dense.registered else []
        return streams + [f"sparse:{name}" for name in (self.sparse.tables if self.sparse else ())]

    def handle_pause_pushes(self, header: dict, arrays: list) -> Reply:
        # ``since``: the first routing version whose pushes reach this server (0, or past the one it
        # joined under); ``routings``: per stream and trainer the newest version its pushes here carried.
        return Reply({"applied": self.gate.pause(), "since": self._joined_at(),
                      "routings": [[stream, t, v] for stream, by in sorted(self.gate.routings.items())
                                   for t, v in sorted(by.items())]})

    def _joined_at(self) -> int:
        for service in self.ctx.services:
            ownership = getattr(service, "ownership", None)
            if ownership is not None:
                return getattr(ownership, "joined_at", 0)
        return 0

    def handle_cut_pushes(self, header: dict, arrays: list) -> Deferred:
        cut = header["cut"]
        if not all(isinstance(c, list) and len(c) == 2 and all(type(x) is int for x in c) for c in cut):
            raise ConfigError("cut_pushes: 'cut' must be a list of [trainer, step] pairs")
        gate = self.gate
        if not gate.paused:
            raise ConfigError("cut_pushes before pause_pushes")
        skip = header.get("skip") or []
        if not all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and type(p[1]) is int for p in skip):
            raise ConfigError("cut_pushes: 'skip' must be a list of [stream, trainer] pairs")
        self._gate_hook.release(gate.set_cut({t: k for t, k in cut}, [(a, b) for a, b in skip]))

        def describe():
            late = gate.missing(self._streams())
            return "pushes up to the cut never arrived: " + ", ".join(
                f"trainer {t} step {k} ({stream})" for stream, t, k in late[:5])
        return Deferred(ready=lambda: not gate.missing(self._streams()), make_reply=lambda: Reply(),
                        describe=describe, waits_on=lambda: sorted({t for _, t, _ in gate.missing(self._streams())}))

    def handle_resume_pushes(self, header: dict, arrays: list) -> Reply:
        held = self.gate.resume()
        self._gate_hook.release(held)
        return Reply({"released": len(held)})

    def stats(self) -> None:
        return None

    def on_leave(self, trainer: int) -> None:
        self.turns.end("checkpoint", trainer)        # a chief gone mid-checkpoint holds no turn

    def reset(self) -> None:
        self._gate_hook.release(self.gate.resume())
        self.turns.end("checkpoint", self.turns.checkpoint)   # a rollback voids the checkpoint in progress
        self.reads.clear()

    # -- dense --------------------------------------------------------------
    def handle_snapshot_dense(self, header: dict, arrays: list) -> Reply:
        store = self.dense
        if not store.registered:
            return Reply({"blocks": [], "versions": [], "slots": 0, "lr_scale": store.lr_scale})
        blocks = list(store.blocks.values())
        out = []
        for b in blocks:
            out.append(b.values.copy())
            out.extend(s.copy() for s in b.slots)
        return Reply({"blocks": [b.name for b in blocks], "versions": [b.version for b in blocks],
                      "slots": len(blocks[0].slots) if blocks else 0, "optimizer": store.registered_optimizer().to_wire(),
                      "plan_fingerprint": store.plan_fingerprint, "lr_scale": store.lr_scale}, out)

    def handle_restore_dense(self, header: dict, arrays: list) -> Reply:
        names, versions, n_slots = header["names"], header["versions"], header["slots"]
        per_block = 1 + n_slots
        if len(versions) != len(names) or len(arrays) != per_block * len(names):
            raise ConfigError(f"restore_dense: {len(names)} blocks, {len(versions)} versions and "
                              f"{len(arrays)} arrays do not fit ({per_block} arrays a block)")
        optimizer = from_wire(header["optimizer"])
        values = arrays[0::per_block]
        slots = [arrays[i * per_block + 1:(i + 1) * per_block] for i in range(len(names))]
        for name, v, ss in zip(names, values, slots):     # check everything before storing anything
            if any(s.shape != v.shape or s.dtype != np.float32 for s in ss):
                raise ConfigError(f"restore_dense: block {name}: optimizer slots do not match its values")
        if any(type(x) is not int or x < 0 for x in versions):
            raise ConfigError("restore_dense: versions must be non-negative integers")
        if self.dense.registered:
            raise ConfigError("restore_dense: this server already holds a model; restore onto fresh servers")
        # The checkpoint's learning-rate scale (1: taken before any change, or before scales existed).
        lr_scale = check_lr_scale(header.get("lr_scale", 1.0), "restore_dense")
        scaled(optimizer, lr_scale)      # a rate that fits float32, checked before anything is stored
        self.dense.register(header["trainer"], names, values, optimizer, header["plan_fingerprint"])
        self.dense.set_lr_scale(lr_scale)
        for name, ss, version in zip(names, slots, versions):
            block = self.dense.blocks[name]
            if len(ss) != len(block.slots):
                self.dense.forget()
                raise ConfigError(f"restore_dense: {len(ss)} optimizer slots a block, "
                                  f"{optimizer.kind} keeps {len(block.slots)}")
            for dst, src in zip(block.slots, ss):
                dst[...] = src
            block.version = version
        return Reply({"blocks": len(names)})

    # -- sparse -------------------------------------------------------------
    def _table(self, name: str) -> SparseTable:
        if self.sparse is None:
            raise ConfigError("this server serves no sparse tables")
        return self.sparse.table(name)

    def handle_snapshot_sparse(self, header: dict, arrays: list) -> Reply | Deferred:
        table = self._table(header["table"])
        start, count = header["start"], header["count"]
        if start < 0 or count < 1:
            raise ConfigError(f"snapshot_sparse: start {start}, count {count}: expected start >= 0, count >= 1")
        version = header.get("min_version", 0)
        if table.version < version:
            # Sync: a sparse push is answered at once, so the chief may ask before the other
            # trainers' pushes of its last step arrived; the snapshot waits for that step.
            return Deferred(ready=lambda: table.version >= version,
                            make_reply=lambda: self._page(table, start, count),
                            describe=lambda: f"table {table.name!r} step {version} is not complete: trainers "
                                             f"{table.waiting_for()} have not pushed",
                            waits_on=table.waiting_for)
        return self._page(table, start, count)

    def _page(self, table: SparseTable, start: int, count: int) -> Reply:
        page = table.snapshot_page(start, count)
        self.reads.served(table.name, start, count, table.num_rows)
        return Reply({"rows": table.num_rows, "version": table.version, "evicted": table.evicted,
                      "lr_scale": table.lr_scale, "parts": list(page)}, list(page.values()))

    def handle_restore_sparse(self, header: dict, arrays: list) -> Reply:
        table = self._table(header["table"])
        if header["trainer"] != 0:
            raise ConfigError(f"trainer {header['trainer']} tried to restore table {table.name!r}: only the chief does")
        parts = header["parts"]
        if len(parts) != len(arrays) or len(set(parts)) != len(parts):
            raise ConfigError(f"restore_sparse: parts {parts} do not match the {len(arrays)} arrays")
        got = dict(zip(parts, arrays))
        ids, values = got.get("ids"), got.get("values")
        if ids is None or values is None:
            raise ConfigError("restore_sparse needs ids and values")
        n = len(ids)
        slots = [got.get(f"slot{i}") for i in range(table.store.slot_count)]
        widths = table.rule.slot_widths(table.dim)       # dim, or 1 for a per-row accumulator
        for name, arr, shape in [("values", values, (n, table.dim))] + [
                (f"slot{i}", s, (n, width)) for i, (s, width) in enumerate(zip(slots, widths))]:
            if arr is None or arr.shape != shape or arr.dtype != np.float32:
                raise ConfigError(f"restore_sparse: table {table.name!r}: {name} must be float32{list(shape)}")
        for name in ("steps", "last_seen"):
            if name in got and got[name].shape != (n,):
                raise ConfigError(f"restore_sparse: {name} must have one entry per id")
        if ids.dtype != np.uint64:
            raise ConfigError("restore_sparse: ids must be uint64")
        if n > 1 and pd.Index(ids).has_duplicates:       # a hash table: far faster than a sort
            raise ConfigError(f"restore_sparse: table {table.name!r}: some ids appear twice")
        if n and (table.store.lookup(ids) >= 0).any():
            raise ConfigError(f"restore_sparse: table {table.name!r} already has rows for some of these ids")
        # The first page says how many rows follow (``reserve``): one allocation instead of one
        # per page. The hint is checked like register_sparse's, before anything is allocated.
        state = {name: got[name] for name in (*(f"slot{i}" for i in range(len(slots))), "steps", "last_seen")
                 if name in got}
        counters = _counters(table.name, got)
        lr_scale = check_lr_scale(header.get("lr_scale", 1.0), f"restore_sparse: table {table.name!r}")
        scaled(table.optimizer, lr_scale)   # checked before any row is stored
        table.restore_rows(ids, values, state, header["version"], header["evicted"],
                           header.get("reserve", 0), counters)
        table.set_lr_scale(lr_scale)
        return Reply({"rows": table.num_rows})


def _counters(table: str, got: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """The admission counters of a restore_sparse page (parts ``counted_ids`` and ``counts``, both
    or neither), checked like its rows before anything is stored: a refusal naming what is wrong,
    never an internal error."""
    ids, counts = got.get("counted_ids"), got.get("counts")
    if ids is None and counts is None:
        return None
    if ids is None or counts is None:
        have, missing = ("counted_ids", "counts") if counts is None else ("counts", "counted_ids")
        raise ConfigError(f"restore_sparse: table {table!r}: part {have!r} comes without {missing!r}: the "
                          f"admission counters need both (one entry of {missing!r} per entry of {have!r})")
    if ids.ndim != 1 or ids.dtype != np.uint64:
        raise ConfigError(f"restore_sparse: table {table!r}: counted_ids must be uint64[n]")
    if counts.shape != ids.shape or counts.dtype.kind not in "iu":
        raise ConfigError(f"restore_sparse: table {table!r}: counts must be integers, one per counted id "
                          f"({len(ids)}), got {counts.dtype}{list(counts.shape)}")
    if len(counts) and counts.min() < 0:
        raise ConfigError(f"restore_sparse: table {table!r}: counts must be >= 0")
    return ids, counts


def attach_checkpoints(server) -> CheckpointService:
    service = CheckpointService(server.dense, server.service(SparseService), server.context)
    server.add_service(service)
    return service


if TYPE_CHECKING:   # `make typecheck` checks the contract: Service (server/core/api.py)
    from paramshard.server.core.api import Service
    _service: type[Service] = CheckpointService
