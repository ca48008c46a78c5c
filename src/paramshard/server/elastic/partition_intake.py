"""The new owner's side of a partition move: pages checked, staged, and made rows at the hand-off.

Pages arrive while the old owner still serves and become rows at once, never served before
the hand-off (``stage``); at the hand-off come the rows written since (and after an eviction
on the old owner, the group's current ids with every row: ``hand_in``), which ``adopt`` writes
over them (server/elastic/migration_service.py).
A page comes from the job's own coordinator, yet is checked as any input: names, dtypes and
shapes against the table's own page layout, before anything is kept.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from paramshard.errors import ConfigError

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
        want_dtype: np.dtype
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
    """Rows of a page become rows of the table as the page arrives (``SparseTable.take_rows``),
    while the old owner still serves them: the hand-off then writes only the rows touched since
    the copy began, however large the partitions (a sync move hands every partition off at one
    step, with the trainers waiting on it). Rows taken in are never served before their
    partition's hand-off: a request touching them is held or refused before it reaches a table.
    A move that stops expecting them (aborted, or stalled) leaves them as strays, dropped a
    slice at a time (``strays``: the migration service drops them)."""

    def __init__(self, partitions_of):
        self.partitions_of = partitions_of
        self.staged: dict[str, set[int]] = {}     # table -> partitions with rows taken in
        self.handed: dict[str, dict] = {}         # table -> the hand-off's page and version

    def clear(self) -> None:
        self.staged, self.handed = {}, {}

    def forget(self) -> None:
        """The move stops expecting partitions: any hand-off in progress goes (the rows taken in
        for them are ``strays`` now)."""
        self.handed = {}

    def stage(self, table, page: dict, expected: np.ndarray) -> None:
        parts = self.partitions_of(page["ids"])
        if not expected[parts].all():
            raise ConfigError("migrate_stage: rows of partitions this server does not expect")
        table.take_rows(page)
        self.staged.setdefault(table.name, set()).update(np.unique(parts).tolist())

    def hand_in(self, table, page: dict, version: int) -> None:
        self.handed[table.name] = {**page, "version": version}

    def adopt(self, tables: dict, parts: np.ndarray, partition_count: int) -> None:
        """Every handed table's rows of ``parts`` as the old owner holds them now; checked for
        each table before any changes."""
        for name, handed in self.handed.items():
            _check_current(tables[name], parts, handed)
        in_parts = np.zeros(partition_count, bool)
        in_parts[parts] = True
        for name, handed in self.handed.items():
            table = tables[name]
            current = handed.get("current")
            if current is not None:
                # An eviction on the old owner during the copy: every row of the partitions came
                # again; rows taken in from earlier pages that it no longer holds go.
                current_ids = pd.Index(current)
                table.drop_now(lambda ids: in_parts[self.partitions_of(ids)] & (current_ids.get_indexer(ids) < 0))
            rows = {n: handed[n] for n in handed if n not in ("version", *_PER_ROW_EXTRA)}
            counters = (handed["counted_ids"], handed["counts"]) if "counted_ids" in handed else None
            table.adopt_rows(rows, handed["version"], counters)
        self.handed = {}
        for staged in self.staged.values():
            staged.difference_update(parts.tolist())

    def strays(self, incoming: np.ndarray) -> dict[str, np.ndarray]:
        """Per table, the partitions whose rows were taken in but are no longer expected."""
        out = {}
        for name, staged in self.staged.items():
            gone = [p for p in staged if not incoming[p]]
            if gone:
                out[name] = np.asarray(gone, np.int64)
                staged.difference_update(gone)
        return out


def _check_current(table, parts: np.ndarray, handed: dict) -> None:
    """After an eviction the hand-off names the partitions' ids (``current``) and sends each
    of their rows: the two must be the same ids."""
    current = handed.get("current")
    if current is None:
        return
    ids = handed["ids"]
    if len(ids) != len(current) or (pd.Index(ids).get_indexer(current) < 0).any():
        raise ConfigError(f"handoff_done: table {table.name!r}: {len(current)} rows in partitions "
                          f"{parts[:5].tolist()}, {len(ids)} handed over: they must be the same")
