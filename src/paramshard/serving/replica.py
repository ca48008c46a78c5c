"""A serving replica: the model of a delta directory (online/delta_log.py), following it while it serves.

It reads DELTA_DIR/model.pt (the module is built from the file's recorded spec, as
``load_model(file)`` builds it) and blocks.json (dense block -> [parameter, offset, elements]),
then, per server, its latest snapshot and the deltas after it, and from then on the files the
servers publish (``poll``, called every ``--poll`` seconds by ``follow``). Rows come from the
servers' snapshots and deltas; the rows in model.pt are served only while no server has published a
snapshot (publishing has just begun). Dense blocks in a file overwrite their slice of the module's
parameter. Two copies of the module and its tables (versions.py) make every change invisible until
it is whole: a prediction reads one version and answers with it.

The *version* is ``{"servers": {server: seq applied}, "step": the least step among them,
"number": switches since start}``. Exactly once: a file whose seq was applied is skipped; a gap
(follow.py) stops that server's following with an error in ``health`` while the replica keeps
serving what it has; a gap a snapshot covers (pruned deltas) is crossed by starting both copies
again from the servers' latest snapshots.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Mapping

import numpy as np
import torch

from paramshard.errors import ConfigError, ParamshardError
from paramshard.log import get_logger
from paramshard.online.delta_format import Delta, DeltaError, read_delta
from paramshard.online.delta_log import DeltaLog
from paramshard.serving import follow
from paramshard.serving.live_table import UNKNOWN, StoreChoice, TableCopy, TableSettings
from paramshard.serving.versions import Broken, Busy, DoubleBuffer

log = get_logger("serve")


class Refused(ParamshardError):
    """A delta that cannot be applied: a gap, or one that does not fit the model."""


def read_blocks(path: Path, params: Mapping[str, torch.Tensor]) -> dict[str, tuple[str, int, int]]:
    """blocks.json: {block: [parameter, offset, elements]}, each slice inside its parameter."""
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{path}: not a JSON object of dense blocks ({exc})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected an object block -> [parameter, offset, elements]")
    blocks = {}
    for name, entry in raw.items():
        if isinstance(entry, dict):
            entry = [entry.get("parameter"), entry.get("offset"), entry.get("elements")]
        ok = isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str) and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in entry[1:])
        if not ok:
            raise ConfigError(f"{path}: block {name!r}: {entry!r} is not [parameter, offset, elements]")
        param, offset, elements = entry
        if param not in params:
            raise ConfigError(f"{path}: block {name!r} names parameter {param!r}, which the model in model.pt "
                              f"does not have")
        if offset + elements > params[param].numel():
            raise ConfigError(f"{path}: block {name!r} ends at element {offset + elements}, past parameter "
                              f"{param!r}'s {params[param].numel()}")
        blocks[name] = (param, offset, elements)
    return blocks


class ModelCopy:
    """One copy of the served model: its module, its tables (live_table.TableCopy), its parameters."""

    def __init__(self, model_file, blocks: dict, choice: StoreChoice, unknown: str, copy: str, build=None):
        from paramshard.inference.serving import build_module, load_model
        from paramshard.trainer.sparse_embedding import tables_of

        self.file = model_file
        if build is None:        # the file's recorded model
            self.module = build_module(model_file, unknown=unknown).eval()
        else:                    # a module of the trained class, made by the caller (one per copy)
            self.module = load_model(build(), model_file.path, unknown).eval()
        self.params = dict(self.module.named_parameters())
        self.blocks = blocks
        self.tables = {name: TableCopy(TableSettings.of(local), choice, copy)
                       for name, local in model_file.tables.items()}
        for name, embedding in tables_of(self.module).items():
            embedding.attach(self.tables[name].row_source(unknown), trainable=False)

    def reset(self, model_rows: bool) -> None:
        """As model.pt has it: dense values, and its rows when ``model_rows`` (else no rows)."""
        with torch.no_grad():
            for name, value in self.file.dense.items():
                self.params[name].copy_(value)
        for name, table in self.tables.items():
            table.clear()
            if model_rows:
                local = self.file.tables[name]
                table.upsert(local.ids, local.rows)

    def apply(self, delta: Delta) -> None:
        """The delta's rows set, its tombstones removed, its dense blocks written (checked first:
        Replica.check)."""
        for name, change in delta.tables.items():
            table = self.tables[name]
            table.remove(change.tombstones)
            table.upsert(change.ids, change.values)
        with torch.no_grad():
            for name, values in delta.dense.items():
                param, offset, elements = self.blocks[name]
                self.params[param].view(-1)[offset:offset + elements] = torch.from_numpy(np.array(values, np.float32))   # a copy: the file's bytes are read-only

    def close(self) -> None:
        for table in self.tables.values():
            table.close()


class Replica:
    def __init__(self, root, store: StoreChoice | None = None, unknown: str = "initial", grace: float = 30.0,
                 build=None):
        """``build``: makes a module of the trained class (called twice: one per copy), for a model
        file without a recorded model; it is then served with ``forward`` (no schema: no JSON rows)."""
        from paramshard.inference.serving import read_model

        if unknown not in UNKNOWN:
            raise ConfigError(f"unknown={unknown!r}: expected one of {UNKNOWN}")
        self.root = Path(root)
        self.log = DeltaLog(self.root)
        if not (self.root / "model.pt").is_file():
            raise ConfigError(f"{self.root}: no model.pt: not a delta directory (a training job publishing "
                              f"deltas writes model.pt there first; check the directory given)")
        self.model_file = read_model(self.root / "model.pt")
        store = store or StoreChoice()
        first = ModelCopy(self.model_file, {}, store, unknown, "a", build)
        blocks = read_blocks(self.root / "blocks.json", first.params)
        first.blocks = blocks
        second = ModelCopy(self.model_file, blocks, store, unknown, "b", build)
        self.buffer: DoubleBuffer[ModelCopy] = DoubleBuffer(first, second, self._version({}, {}), grace)
        self.applied: dict[int, int] = {}        # server -> seq of its last file in the live version
        self.steps: dict[int, int] = {}           # server -> step of that file
        self.newest_created: float | None = None  # `created` of the newest file applied
        self.files_applied = 0
        self.start_s = 0.0                        # seconds start() took to load both copies
        self.rows_applied = 0
        self.errors: dict[str, str] = {}          # what stops following: "server 1" / "apply" -> why
        self.last_error: str | None = None
        from paramshard.models.heads import head_of
        from paramshard.serving.rows import RowEncoder
        self.head = head_of(first.module)
        # JSON rows need the recorded schema; a module of the caller's is served with forward().
        self.encoder = RowEncoder(first.module, self.root / "model.pt") if self.model_file.spec else None
        self._lock = threading.Lock()             # one poll at a time
        self._stop = threading.Event()

    # -- version ---------------------------------------------------------------------------------
    def _version(self, applied: dict, steps: dict) -> dict:
        return {"servers": {str(s): seq for s, seq in sorted(applied.items())},
                "step": min(steps.values()) if steps else self.model_file.step,
                "number": getattr(getattr(self, "buffer", None), "switches", 0)}

    @property
    def version(self) -> dict:
        return self.buffer.version

    def freshness(self) -> float | None:
        """Seconds since the newest applied file was created (None: none applied yet)."""
        return None if self.newest_created is None else max(0.0, time.time() - self.newest_created)

    # -- starting --------------------------------------------------------------------------------
    def start(self) -> "Replica":
        """Both copies from the servers' latest snapshots and the deltas after them."""
        with self._lock:
            self._restart()
        # The start's load is not a delta's apply: /health and /metrics report it apart.
        self.start_s, self.buffer.max_apply_s = self.buffer.last_apply_s, 0.0
        return self

    def _restart(self) -> int:
        bases, plan = follow.start_plan(self.log)
        # Each server's snapshot then its deltas, all merged by the time written (online/rebuild.py's order).
        queues = {s: [e for e in [bases[s]] if e is not None] + plan.files[s] for s in bases}
        deltas = follow.read_in_order(queues, limit=1 << 62)
        for delta in deltas:
            self.check(delta)
        applied = {server: (entry.seq if entry else 0) for server, entry in bases.items()}
        steps: dict[int, int] = {}
        for delta in deltas:
            applied[delta.server] = delta.seq
            steps[delta.server] = delta.step
        has_snapshot = any(entry is not None for entry in bases.values())
        model_rows = not has_snapshot

        def change(copy: ModelCopy) -> None:
            copy.reset(model_rows)
            for delta in deltas:
                copy.apply(delta)

        self.buffer.apply(change, self._version(applied, steps) | {"number": self.buffer.switches + 1})
        self.applied, self.steps = applied, steps
        self._note(deltas)
        self.errors = {f"server {s}": why for s, why in plan.gaps.items()}
        for why in plan.gaps.values():
            self._error(why)
        log.info(f"serving {self.root}: version {self.version} ({sum(t.num_rows for t in self.live_tables().values())} "
                 f"rows, {len(deltas)} files)")
        return len(deltas)

    def live_tables(self) -> dict[str, TableCopy]:
        with self.buffer.reading() as (copy, _):
            return copy.tables

    # -- following -------------------------------------------------------------------------------
    def poll(self) -> int:
        """Apply what the servers published since the last poll; how many files were applied. Errors
        are kept for ``health`` (and logged), never raised: the replica serves on."""
        with self._lock:
            try:
                plan = follow.follow_plan(self.log, self.applied)
                if plan.restart:
                    log.info(f"{self.root}: a gap a snapshot covers, a server started again or a new server: "
                             f"starting again from the servers' latest snapshots")
                    return self._restart()
                # Replaced, never changed in place: health() reads it from HTTP threads without the lock.
                errors = {k: v for k, v in self.errors.items()
                          if not k.startswith("server ") or int(k.split()[1]) in plan.gaps}   # gaps filled go
                for server, why in plan.gaps.items():
                    if errors.get(f"server {server}") != why:
                        self._error(why)
                    errors[f"server {server}"] = why
                self.errors = errors
                count = 0
                for delta in follow.read_in_order(plan.files):
                    self._apply(delta)
                    count += 1
                self.errors = {k: v for k, v in self.errors.items() if k != "apply"}
                return count
            except (DeltaError, Refused, Busy, Broken, ConfigError, OSError) as exc:
                if self.errors.get("apply") != str(exc):      # once, not at every poll
                    self._error(str(exc))
                self.errors = self.errors | {"apply": str(exc)}
                return 0

    def apply(self, delta: Delta) -> bool:
        """Apply one delta exactly once: True when applied, False when its seq was applied already
        (a no-op); Refused for a gap (nothing changes) or a delta that does not fit the model."""
        with self._lock:
            return self._apply(delta)

    def _apply(self, delta: Delta) -> bool:
        if delta.kind != "delta":
            raise Refused(f"server {delta.server} snapshot {delta.seq}: a running replica starts again from "
                          f"snapshots (start()), it does not apply one on top of its rows")
        applied = self.applied.get(delta.server, 0)
        if delta.seq <= applied:
            return False
        if delta.seq != applied + 1:
            raise Refused(follow.gap_message(self.log, delta.server, applied, delta.seq))
        self.check(delta)
        applied_after = self.applied | {delta.server: delta.seq}
        steps_after = self.steps | {delta.server: delta.step}
        self.buffer.apply(lambda copy: copy.apply(delta),
                          self._version(applied_after, steps_after) | {"number": self.buffer.switches + 1})
        self.applied, self.steps = applied_after, steps_after
        self._note([delta])
        return True

    def check(self, delta: Delta) -> None:
        """Everything a change needs, before it touches a copy (a copy is never left half-changed)."""
        where = f"server {delta.server} {delta.kind} {delta.seq}"
        copy = self.buffer.copies[0]
        for name, change in delta.tables.items():
            table = copy.tables.get(name)
            if table is None:
                raise Refused(f"{where}: table {name!r} is not in the served model (tables: "
                              f"{', '.join(copy.tables) or 'none'}): the delta directory holds another model")
            if change.dim != table.dim:
                raise Refused(f"{where}: table {name!r} rows are dim {change.dim}, the model's are dim {table.dim}")
            if len(change.ids) > 1 and len(np.unique(change.ids)) != len(change.ids):
                raise Refused(f"{where}: table {name!r} sets an id twice")
        for name, values in delta.dense.items():
            block = copy.blocks.get(name)
            if block is None:
                raise Refused(f"{where}: dense block {name!r} is not in {self.root / 'blocks.json'}")
            if block[2] != len(values):
                raise Refused(f"{where}: dense block {name!r} has {len(values)} elements, blocks.json says {block[2]}")

    def _note(self, deltas: list[Delta]) -> None:
        for delta in deltas:
            self.files_applied += 1
            self.rows_applied += sum(len(t.ids) for t in delta.tables.values())
            if self.newest_created is None or delta.created > self.newest_created:
                self.newest_created = delta.created

    def _error(self, why: str) -> None:
        self.last_error = why
        log.warning(why)

    def follow(self, interval: float) -> None:
        """Poll every ``interval`` seconds until ``stop()``."""
        while not self._stop.wait(interval):
            self.poll()

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self.stop()
        for copy in self.buffer.copies:
            copy.close()

    # -- serving ---------------------------------------------------------------------------------
    def score(self, columns: dict) -> tuple[np.ndarray, dict]:
        """(scores of the rows in ``columns``, the version that answered): the columns as
        serving/rows.py makes them, encoded with the model's fitted schema as `paramshard predict`
        encodes a file's. Refused (a bad row, named) before the model runs."""
        if self.encoder is None:
            raise ConfigError(f"{self.root / 'model.pt'}: the model records no schema to encode rows with (a model "
                              f"built by paramshard.models.build_model records one): call Replica.forward")
        return self.score_batch(self.encoder.encode(columns))

    def score_batch(self, batch) -> tuple[np.ndarray, dict]:
        """(scores of a TabularBatch's rows, the version that answered)."""
        # The tensors are made outside inference mode: the model's tables key a batch by its ids
        # tensor's version counter (trainer/sparse_embedding.py), which inference tensors lack.
        t = batch.torch()
        with self.buffer.reading() as (copy, version):
            # inference_mode: no autograd bookkeeping at all (no_grad still tracks versions and views).
            with torch.inference_mode():
                raw = copy.module(t["dense"], t["ids"], t["offsets"], t["weights"])
                scores = self.head.scores(raw).double().numpy()
        return scores, version

    def forward(self, *inputs) -> tuple[torch.Tensor, dict]:
        """(the module's output for ``inputs``, the version that answered), without gradients."""
        with self.buffer.reading() as (copy, version):
            with torch.no_grad():
                return copy.module(*inputs), version

    def health(self) -> dict:
        rows = {name: t.num_rows for name, t in self.live_tables().items()}
        return {"ok": not self.errors and not self.buffer.broken, "version": self.version,
                "freshness_s": self.freshness(), "files_applied": self.files_applied, "rows": rows,
                "errors": dict(self.errors) | ({"broken": self.buffer.broken} if self.buffer.broken else {}),
                "last_error": self.last_error,
                "apply_s": {"last": self.buffer.last_apply_s, "max": self.buffer.max_apply_s, "start": self.start_s},
                "max_lookup_stall_s": self.buffer.max_stall_s,
                "encoded": None if self.encoder is None else {"fast": self.encoder.fast.fast,
                                                              "encoder": self.encoder.fast.fallbacks}}
