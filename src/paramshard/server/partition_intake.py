"""The new owner's side of a partition move: pages checked, staged, and made rows at the hand-off.

Pages arrive while the old owner still serves (``stage``); at the hand-off come the group's
current ids and its dirty rows (``hand_in``); ``adopt`` makes rows of the staged ones still
current and not dirty, plus the dirty ones, with their state (server/migration_service.py).
A page comes from the job's own coordinator, yet is checked as any input: names, dtypes and
shapes against the table's own page layout, before anything is kept.
"""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError

_ID_PARTS = ("ids", "current", "counted_ids")
_PER_ROW_EXTRA = ("current", "counted_ids", "counts")     # not one entry per row of ``ids``


def checked_page(table, parts: list, arrays: list) -> dict[str, np.ndarray]:
    """A page's arrays by name, as the table's own pages are (RowStore.page), copied."""
    if len(parts) != len(arrays) or "ids" not in parts or len(set(parts)) != len(parts):
        raise ConfigError("a page must name each of its arrays once, ids among them")
    layout = table.store.page(0, 0)           # the names, dtypes and row shapes of this table's pages
    page = dict(zip(parts, arrays))
    n = len(page["ids"])
    for name, a in page.items():
        if name in _ID_PARTS:
            want_dtype, want_shape = np.dtype(np.uint64), (len(a),)
        elif name == "counts":
            want_dtype, want_shape = np.dtype(np.int64), (len(page.get("counted_ids", ())),)
        elif name in layout:
            want_dtype, want_shape = layout[name].dtype, (n, *layout[name].shape[1:])
        else:
            raise ConfigError(f"table {table.name!r}: a page part {name!r} this table does not have "
                              f"(it has {sorted(layout)})")
        if name in ("steps", "last_seen"):
            want_dtype = np.dtype(np.int64)
        if a.dtype != want_dtype or a.shape != want_shape:
            raise ConfigError(f"table {table.name!r}: page part {name!r} is {a.dtype}{list(a.shape)}, expected "
                              f"{want_dtype}{list(want_shape)}")
    if "values" not in page:
        raise ConfigError(f"table {table.name!r}: a page without values")
    return {k: np.array(v) for k, v in page.items()}


class PartitionIntake:
    def __init__(self, partitions_of):
        self.partitions_of = partitions_of
        self.staged: dict[str, dict[int, list[dict]]] = {}    # table -> partition -> pages
        self.handed: dict[str, dict] = {}                     # table -> the hand-off's page and version

    def clear(self) -> None:
        self.staged, self.handed = {}, {}

    def stage(self, table, page: dict, expected: np.ndarray) -> None:
        parts = self.partitions_of(page["ids"])
        if not expected[parts].all():
            raise ConfigError("migrate_stage: rows of partitions this server does not expect")
        staged = self.staged.setdefault(table.name, {})
        order = np.argsort(parts, kind="stable")          # one pass, not one mask per partition
        by_partition = {k: v[order] for k, v in page.items()}
        present, starts = np.unique(parts[order], return_index=True)
        ends = np.append(starts[1:], len(order))
        for p, lo, hi in zip(present.tolist(), starts.tolist(), ends.tolist()):
            staged.setdefault(p, []).append({k: v[lo:hi] for k, v in by_partition.items()})

    def hand_in(self, table, page: dict, version: int) -> None:
        self.handed[table.name] = {**page, "version": version}

    def adopt(self, tables: dict, parts: np.ndarray) -> None:
        """Every handed table's rows of ``parts`` made rows here; checked for each table first."""
        made = {name: self._rows(tables[name], parts, handed) for name, handed in self.handed.items()}
        for name, (rows, handed) in made.items():
            self._create(tables[name], rows, handed)
        self.handed = {}
        for staged in self.staged.values():
            for p in parts.tolist():
                staged.pop(p, None)

    def _rows(self, table, parts: np.ndarray, handed: dict):
        """Staged rows still current and not dirty, and the dirty rows: the partitions' rows."""
        pages = [pg for p in parts.tolist() for pg in self.staged.get(table.name, {}).get(p, [])]
        current, dirty = handed.get("current"), handed["ids"]
        names = [n for n in handed if n not in ("version", *_PER_ROW_EXTRA)]
        if current is not None:       # an eviction during the copy: every row came again
            rows = {n: handed[n] for n in names}
        elif pages:
            staged = {n: np.concatenate([pg[n] for pg in pages]) for n in names}
            keep = ~np.isin(staged["ids"], dirty)
            rows = {n: np.concatenate([staged[n][keep], handed[n]]) for n in names}
        else:
            rows = {n: handed[n] for n in names}
        if current is not None and (len(rows["ids"]) != len(current) or not np.isin(current, rows["ids"]).all()):
            raise ConfigError(f"handoff_done: table {table.name!r}: {len(current)} rows in partitions "
                              f"{parts[:5].tolist()}, {len(rows['ids'])} staged or handed over: they must be the same")
        return rows, handed

    @staticmethod
    def _create(table, rows: dict, handed: dict) -> None:
        table.version = max(table.version, handed["version"])      # a joining server: the step it starts at
        stale = table.store.lookup(rows["ids"])
        if (stale >= 0).any():       # left from an earlier stay of these partitions here
            table.store.drop(rows["ids"][stale >= 0])
            table._last_pull.clear()
            if table.changes is not None:
                table.changes.everything()
        state = {n: a for n, a in rows.items() if n not in ("ids", "values")}
        table.reserve(table.num_rows + len(rows["ids"]))
        before = table.num_rows
        table._create(rows["ids"], rows["values"], table.version, state)
        if table.changes is not None:        # bounded-loss: the replica takes the adopted rows too
            table.changes.grew(before, table.num_rows)
        if "counted_ids" in handed and len(handed["counted_ids"]):
            table.store.restore_counts(handed["counted_ids"], handed["counts"].astype(np.uint32))
