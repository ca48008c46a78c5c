"""The new owner's side of a partition move: pages checked, staged, and made rows at the hand-off.

Pages arrive while the old owner still serves (``stage``); at the hand-off come the group's
current ids and its dirty rows (``hand_in``); ``adopt`` makes rows of the staged ones still
current and not dirty, plus the dirty ones, with their state (server/migration_service.py).
A page comes from the job's own coordinator, yet is checked as any input: names, dtypes and
shapes against the table's own page layout, before anything is kept.

Staged pages count in the server's memory budget (server/memory_budget.py), in RAM up to half of
it; a page that does not fit is written to a spill file (plain .npz, no pickle) in a temporary
directory and read back at the hand-off, so a move of a table bigger than the budget still
completes. Every staged page goes (from RAM or disk) when its partitions are adopted or forgotten.
"""
from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np

from ..errors import ConfigError

_ID_PARTS = ("ids", "current", "counted_ids")
_PER_ROW_EXTRA = ("current", "counted_ids", "counts")     # not one entry per row of ``ids``


def checked_page(table, parts: list, arrays: list) -> dict[str, np.ndarray]:
    """A page's arrays by name, as the table's own pages are (RowStore.page), copied."""
    if len(parts) != len(arrays) or "ids" not in parts or len(set(parts)) != len(parts):
        raise ConfigError("a page must name each of its arrays once, ids among them")
    layout = table.page_layout()             # the names, dtypes and row shapes of this table's pages
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


class _Spilled:
    """A staged piece written to a file (the budget had no room for it in RAM)."""
    __slots__ = ("path",)

    def __init__(self, path: str):
        self.path = path

    def load(self) -> dict[str, np.ndarray]:
        with np.load(self.path, allow_pickle=False) as saved:
            return {name: saved[name] for name in saved.files}


class PartitionIntake:
    def __init__(self, partitions_of, budget_of=lambda: None):
        self.partitions_of = partitions_of
        self.budget_of = budget_of      # the server's MemoryBudget (None: no budget, all in RAM)
        self.staged: dict[str, dict[int, list]] = {}           # table -> partition -> pieces (dict or _Spilled)
        self.handed: dict[str, dict] = {}                     # table -> the hand-off's page and version
        self.spilled = 0                                      # pieces written to files (stats, tests)
        self._spill_dir: str | None = None
        self._spill_count = 0

    def clear(self) -> None:
        for staged in self.staged.values():
            for p in list(staged):
                self._drop(staged.pop(p))
        self.staged, self.handed = {}, {}
        if self._spill_dir is not None:
            shutil.rmtree(self._spill_dir, ignore_errors=True)
            self._spill_dir = None

    def forget(self, parts: np.ndarray) -> None:
        """An aborted move: the staged rows of ``parts`` and any hand-off in progress go."""
        self.handed = {}
        for staged in self.staged.values():
            for p in parts.tolist():
                self._drop(staged.pop(p, []))
        self._tidy()

    def _tidy(self) -> None:
        """No piece left on disk: the spill directory goes."""
        if self._spill_dir is not None and not any(isinstance(piece, _Spilled) for staged in self.staged.values()
                                                   for pieces in staged.values() for piece in pieces):
            shutil.rmtree(self._spill_dir, ignore_errors=True)
            self._spill_dir = None

    def _drop(self, pieces: list) -> None:
        """Staged pieces that go: their bytes leave the budget, their spill files the disk."""
        budget = self.budget_of()
        for piece in pieces:
            if isinstance(piece, _Spilled):
                try:
                    os.unlink(piece.path)
                except FileNotFoundError:
                    pass
            elif budget is not None:
                budget.unstage(_nbytes(piece))

    def _keep(self, piece: dict[str, np.ndarray]):
        """The piece itself if the budget has room for it in RAM, else its spill file."""
        budget = self.budget_of()
        if budget is None or budget.stage(_nbytes(piece)):
            return piece
        if self._spill_dir is None:
            self._spill_dir = tempfile.mkdtemp(prefix="paramshard-staged-")
        self._spill_count += 1
        path = os.path.join(self._spill_dir, f"{self._spill_count}.npz")
        np.savez(path, **piece)
        self.spilled += 1
        return _Spilled(path)

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
            # A copy: a slice would keep the whole page alive after the other partitions' went.
            staged.setdefault(p, []).append(self._keep({k: v[lo:hi].copy() for k, v in by_partition.items()}))

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
                self._drop(staged.pop(p, []))
        self._tidy()

    def _rows(self, table, parts: np.ndarray, handed: dict):
        """Staged rows still current and not dirty, and the dirty rows: the partitions' rows."""
        pages = [pg.load() if isinstance(pg, _Spilled) else pg
                 for p in parts.tolist() for pg in self.staged.get(table.name, {}).get(p, [])]
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
        # A joining server starts at the hand-off's step; rows left from an earlier stay of these
        # partitions here go first (SparseTable.adopt_rows).
        counters = (handed["counted_ids"], handed["counts"]) if "counted_ids" in handed else None
        table.adopt_rows(rows, handed["version"], counters)


def _nbytes(piece: dict[str, np.ndarray]) -> int:
    return sum(a.nbytes for a in piece.values())
