"""One server's replica as the keeper holds it (pure: no sockets).

``apply`` folds a ``replica_delta`` reply (server/elastic/replication.py) into the copy,
checking every array against what the header says before keeping anything;
``restore_requests`` gives the ordinary restore ops that put the copy onto a
server restarted in place (the ones a checkpoint restore sends), then
``replica_resume``.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from paramshard.errors import ProtocolError

RESTORE_PAGE_ROWS = 65536       # rows a restore_sparse request carries


@dataclasses.dataclass
class TableCopy:
    spec: dict
    slot_widths: list = dataclasses.field(default_factory=list)
    version: int = 0
    evicted: int = 0
    lr_scale: float = 1.0
    rows: int = 0
    pages: dict = dataclasses.field(default_factory=dict)        # page index -> {part: array}
    counters: tuple | None = None

    def row_parts(self) -> dict[str, np.ndarray]:
        """Every row held, by part (ids, values, slots, steps, last_seen), pages in order."""
        pages = [self.pages[p] for p in sorted(self.pages)]
        if not pages:
            return {}
        return {name: np.concatenate([p[name] for p in pages]) for name in pages[0]}


@dataclasses.dataclass
class ServerReplica:
    epoch: int = 0
    dense: dict | None = None              # header fields of restore_dense, without arrays
    blocks: dict = dataclasses.field(default_factory=dict)       # block -> [values, slot...]
    versions: dict = dataclasses.field(default_factory=dict)     # block -> version
    tables: dict = dataclasses.field(default_factory=dict)       # name -> TableCopy
    steps: dict = dataclasses.field(default_factory=dict)        # stream -> [[trainer, step], ...]
    complete: bool = False                 # a whole copy arrived (no ``more`` pending)

    def applied_updates(self) -> int:
        """Pushes this copy holds, summed over streams (dense blocks count once a push)."""
        return sum(step + 1 for pairs in self.steps.values() for _, step in pairs)

    def apply(self, header: dict, arrays: list) -> int:
        """Fold one delta in (``full`` in it: a whole copy, drop what is held). Returns bytes taken."""
        full = header.get("full") is True
        arrays = list(arrays)
        taken = sum(a.nbytes for a in arrays)
        dense, tables = header.get("dense"), header.get("tables")
        if not isinstance(tables, dict) or not isinstance(header.get("steps"), dict):
            raise ProtocolError("replica_delta reply: 'tables' and 'steps' must be maps")
        blocks = self._dense_part(dense, arrays)
        table_parts = {name: self._table_part(name, t, arrays) for name, t in tables.items()}
        if arrays:
            raise ProtocolError(f"replica_delta reply: {len(arrays)} arrays more than its header names")
        # Everything checked: keep it.
        if full:
            self.blocks, self.versions, self.tables, self.complete = {}, {}, {}, False
        if dense is not None:
            self.dense = {k: dense[k] for k in ("slots", "optimizer", "plan_fingerprint", "lr_scale")}
            self.blocks.update(blocks)
            self.versions.update(zip(dense["names"], dense["versions"]))
            for gone in set(self.blocks) - set(dense["all"]):
                del self.blocks[gone], self.versions[gone]
        for name, (t, pages, counters) in table_parts.items():
            copy = self.tables.get(name)
            if copy is None or t["whole"]:
                copy = self.tables[name] = TableCopy(t["spec"])
            copy.spec, copy.slot_widths, copy.version, copy.evicted, copy.lr_scale, copy.rows = (
                t["spec"], t["slot_widths"], t["version"], t["evicted"], t["lr_scale"], t["rows"])
            copy.pages.update(pages)       # a table only shrinks by eviction, which sends it whole
            copy.counters = counters
        for gone in set(self.tables) - set(tables):
            del self.tables[gone]
        self.epoch, self.steps = header["epoch"], header["steps"]
        if not header.get("more"):
            self.complete = True
        return taken

    @staticmethod
    def _dense_part(dense: dict | None, arrays: list) -> dict:
        if dense is None:
            return {}
        per_block = 1 + dense["slots"]
        out = {}
        for name in dense["names"]:
            got = arrays[:per_block]
            del arrays[:per_block]
            if len(got) != per_block or any(a.dtype != np.float32 or a.shape != got[0].shape for a in got):
                raise ProtocolError(f"replica_delta reply: block {name!r} needs {per_block} float32 arrays of one shape")
            out[name] = [np.array(a) for a in got]
        return out

    @staticmethod
    def _table_part(name: str, t: dict, arrays: list):
        pages = {}
        for page, parts in zip(t["pages"], t["parts"]):
            got = arrays[:len(parts)]
            del arrays[:len(parts)]
            if len(got) != len(parts) or "ids" not in parts or len({len(a) for a in got}) != 1:
                raise ProtocolError(f"replica_delta reply: table {name!r} page {page}: parts {parts} do not "
                                    f"match its arrays")
            pages[page] = {p: np.array(a) for p, a in zip(parts, got)}
        counters = None
        if t["counters"]:
            counters = tuple(np.array(a) for a in arrays[:2])
            del arrays[:2]
            if len(counters) != 2 or len(counters[0]) != len(counters[1]):
                raise ProtocolError(f"replica_delta reply: table {name!r}: admission counters do not pair up")
        return t, pages, counters

    def restore_requests(self) -> list[tuple[dict, list]]:
        """(header, arrays) of every request that rebuilds this copy on a restarted server, in order."""
        out: list[tuple[dict, list]] = []
        if self.dense is not None and self.blocks:
            names = sorted(self.blocks)
            out.append(({"op": "restore_dense", "names": names, "versions": [self.versions[n] for n in names],
                         "trainer": 0, **self.dense, "lr_scale": float(self.dense["lr_scale"])}, [a for n in names for a in self.blocks[n]]))
        for name, copy in self.tables.items():
            out.append(({"op": "register_sparse", **copy.spec, "trainer": 0, "reserve": copy.rows}, []))
            rows = copy.row_parts()
            n = len(rows.get("ids", ()))
            for start in range(0, max(n, 1), RESTORE_PAGE_ROWS):
                part = {k: v[start:start + RESTORE_PAGE_ROWS] for k, v in rows.items()} if n else {
                    "ids": np.empty(0, np.uint64), "values": np.empty((0, copy.spec["dim"]), np.float32),
                    **{f"slot{i}": np.empty((0, w), np.float32) for i, w in enumerate(copy.slot_widths)}}
                if start == 0 and copy.counters is not None:
                    part["counted_ids"], part["counts"] = copy.counters
                out.append(({"op": "restore_sparse", "table": name, "parts": list(part), "version": copy.version,
                             "evicted": copy.evicted, "trainer": 0, "lr_scale": float(copy.lr_scale),
                             **({"reserve": n} if start == 0 else {})}, list(part.values())))
        out.append(({"op": "replica_resume", "epoch": self.epoch, "steps": self.steps}, []))
        return out

