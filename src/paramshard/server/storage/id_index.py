"""uint64 id -> row number 0..size-1: an open-addressing hash table in numpy arrays.

The ids live in ``ids`` in row order (8 bytes a row, what export and eviction
need anyway); the buckets hold only int32 row numbers (-1: empty) and are kept
between 3/8 and 3/4 full, about 14 bytes a row in all. Lookups and inserts
are vectorised: each round of linear probing is a few array operations over
the ids still unresolved, so there is no Python loop per id.
"""
from __future__ import annotations

import numpy as np

from paramshard.placement.sparse_hash import mix64

MAX_LOAD = 0.75
GROWTH = 1.25      # the ids array grows by a quarter, like a table's rows


TOMBSTONE = -2    # a bucket emptied by ``delete``: lookups probe past it, inserts never reuse it


class IdIndex:
    def __init__(self, capacity: int = 1024):
        self._start(capacity)

    def _start(self, capacity: int) -> None:
        """Empty, with room for ``capacity`` ids (a new index, or one rebuilt)."""
        self.ids = np.empty(max(capacity, 16), np.uint64)
        self.size = 0
        self.tombstones = 0       # they fill the buckets as ids do, until the next rehash drops them
        self._alloc(self._buckets_for(capacity))

    @staticmethod
    def _buckets_for(rows: int) -> int:
        return 1 << max(4, int(np.ceil(np.log2(max(rows, 1) / MAX_LOAD))))

    def _alloc(self, buckets: int) -> None:
        self.buckets = np.full(buckets, -1, np.int32)
        self.mask = np.uint64(buckets - 1)

    @property
    def nbytes(self) -> int:
        return self.ids.nbytes + self.buckets.nbytes

    def ids_by_row(self) -> np.ndarray:
        return self.ids[:self.size]

    def reserve(self, rows: int) -> None:
        """Room for ``rows`` ids without growing: the id store and buckets sized now (the
        table's capacity hint), so filling never rehashes. Built aside, then swapped in."""
        if rows <= len(self.ids) and self._buckets_for(rows + self.tombstones) <= len(self.buckets):
            return
        store = np.empty(max(rows, len(self.ids)), np.uint64)
        store[:self.size] = self.ids[:self.size]
        buckets = np.full(max(self._buckets_for(rows), len(self.buckets)), -1, np.int32)
        self._place(store, buckets, np.arange(self.size))
        self.ids, self.buckets, self.mask = store, buckets, np.uint64(len(buckets) - 1)
        self.tombstones = 0

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Row of each id, -1 where absent."""
        ids = np.asarray(ids, np.uint64)
        out = np.full(len(ids), -1, np.int64)
        pos = mix64(ids) & self.mask
        active = np.arange(len(ids))
        while active.size:
            p = pos[active]
            rows = self.buckets[p]
            occupied = rows >= 0
            hit = occupied.copy()
            hit[occupied] = self.ids[rows[occupied]] == ids[active[occupied]]
            out[active[hit]] = rows[hit]
            go_on = (occupied & ~hit) | (rows == TOMBSTONE)
            active = active[go_on]
            pos[active] = (p[go_on] + np.uint64(1)) & self.mask
        return out

    def insert(self, ids: np.ndarray) -> np.ndarray:
        """Give ids that are absent and distinct (the caller guarantees both) the
        next row numbers; returns them."""
        ids = np.asarray(ids, np.uint64)
        first, n = self.size, len(ids)
        # All-or-nothing: new arrays are built aside and swapped in at the end,
        # so a MemoryError leaves the index mapping exactly what it mapped.
        store = self.ids
        if first + n > len(store):
            store = np.empty(max(first + n, int(len(self.ids) * GROWTH) + 1), np.uint64)
            store[:first] = self.ids[:first]
        store[first:first + n] = ids      # beyond ``size``: invisible until committed
        rows = np.arange(first, first + n)
        if first + n + self.tombstones > MAX_LOAD * len(self.buckets):
            buckets = np.full(self._buckets_for(first + n), -1, np.int32)
            self._place(store, buckets, np.arange(first + n))
            self.tombstones = 0
        else:
            buckets = self.buckets
            try:
                self._place(store, buckets, rows)
            except BaseException:
                buckets[buckets >= first] = -1   # only free buckets were written: undo exactly those
                raise
        self.ids, self.size = store, first + n
        self.buckets, self.mask = buckets, np.uint64(len(buckets) - 1)
        return rows

    @staticmethod
    def _place(store: np.ndarray, buckets: np.ndarray, rows: np.ndarray) -> None:
        mask = np.uint64(len(buckets) - 1)
        pos = mix64(store[rows]) & mask
        rows32 = rows.astype(np.int32)
        active = np.arange(len(rows))
        while active.size:
            p = pos[active]
            free = buckets[p] == -1
            claim = active[free]
            buckets[pos[claim]] = rows32[claim]           # colliding claims: one write wins
            won = buckets[pos[claim]] == rows32[claim]
            active = np.concatenate([active[~free], claim[~won]])
            pos[active] = (pos[active] + np.uint64(1)) & mask

    def _bucket_of_rows(self, rows: np.ndarray) -> np.ndarray:
        """The bucket of each of ``rows`` (indexed, distinct)."""
        out = np.empty(len(rows), np.int64)
        pos = mix64(self.ids[rows]) & self.mask
        active = np.arange(len(rows))
        while active.size:
            hit = self.buckets[pos[active]] == rows[active]
            out[active[hit]] = pos[active[hit]].astype(np.int64)
            active = active[~hit]
            pos[active] = (pos[active] + np.uint64(1)) & self.mask
        return out

    def delete(self, rows: np.ndarray) -> None:
        """Unindex rows ``rows`` (distinct; their ids still in ``ids``): per row, not per table."""
        self.buckets[self._bucket_of_rows(np.asarray(rows, np.int64))] = TOMBSTONE
        self.tombstones += len(rows)

    def move_rows(self, movers: np.ndarray, holes: np.ndarray, size: int) -> None:
        """Rows ``movers`` now live at ``holes``; the index holds ``size`` rows."""
        where = self._bucket_of_rows(np.asarray(movers, np.int64))
        self.ids[holes] = self.ids[movers]
        self.buckets[where] = np.asarray(holes, np.int32)
        self.size = size

    def rebuild(self, ids_by_row: np.ndarray) -> None:
        """Start over holding ids_by_row[i] -> i (after rows were compacted)."""
        self._start(len(ids_by_row))
        self.insert(ids_by_row)
