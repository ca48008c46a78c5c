"""uint64 id -> row number, an open-addressing hash table in numpy arrays.

Lookups and inserts are vectorised: each round of linear probing is a few
array operations over the ids still unresolved, so there is no Python loop
per id. 12 bytes a bucket (uint64 key + int32 row), kept between 3/8 and 3/4
full. Deletion is by ``rebuild`` after a table compacts its rows (eviction).
"""
from __future__ import annotations

import numpy as np

from ..sparse_hash import mix64

EMPTY = np.uint64(0xFFFFFFFFFFFFFFFF)   # reserved: the one id a table cannot hold
MAX_LOAD = 0.75


class IdIndex:
    def __init__(self, capacity: int = 1024):
        buckets = 1 << max(4, int(np.ceil(np.log2(max(capacity, 1) / MAX_LOAD))))
        self._alloc(buckets)
        self.size = 0

    def _alloc(self, buckets: int) -> None:
        self.keys = np.full(buckets, EMPTY, np.uint64)
        self.rows = np.zeros(buckets, np.int32)
        self.mask = np.uint64(buckets - 1)

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.rows.nbytes

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Row of each id, -1 where absent."""
        ids = np.asarray(ids, np.uint64)
        out = np.full(len(ids), -1, np.int64)
        pos = mix64(ids) & self.mask
        active = np.arange(len(ids))
        while active.size:
            p = pos[active]
            k = self.keys[p]
            hit = k == ids[active]
            out[active[hit]] = self.rows[p[hit]]
            go_on = ~(hit | (k == EMPTY))
            active = active[go_on]
            pos[active] = (p[go_on] + np.uint64(1)) & self.mask
        return out

    def insert(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Add ids that are absent and distinct (the caller guarantees both)."""
        ids = np.asarray(ids, np.uint64)
        if (ids == EMPTY).any():
            raise ValueError("id 2**64-1 is reserved and cannot be stored")
        if (self.size + len(ids)) > MAX_LOAD * len(self.keys):
            self._grow(self.size + len(ids))
        self._place(ids, np.asarray(rows, np.int32))
        self.size += len(ids)

    def _place(self, ids: np.ndarray, rows: np.ndarray) -> None:
        pos = mix64(ids) & self.mask
        active = np.arange(len(ids))
        while active.size:
            p = pos[active]
            free = self.keys[p] == EMPTY
            claim = active[free]
            self.keys[pos[claim]] = ids[claim]            # colliding claims: one write wins
            won = self.keys[pos[claim]] == ids[claim]
            self.rows[pos[claim[won]]] = rows[claim[won]]
            active = np.concatenate([active[~free], claim[~won]])
            pos[active] = (pos[active] + np.uint64(1)) & self.mask

    def _grow(self, needed: int) -> None:
        occupied = self.keys != EMPTY
        keys, rows = self.keys[occupied], self.rows[occupied]
        buckets = len(self.keys)
        while needed > MAX_LOAD * buckets:
            buckets *= 2
        self._alloc(buckets)
        self._place(keys, rows)

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        occupied = self.keys != EMPTY
        return self.keys[occupied], self.rows[occupied]

    def rebuild(self, ids_by_row: np.ndarray) -> None:
        """Start over holding ids_by_row[i] -> i (after rows were compacted)."""
        self.__init__(len(ids_by_row))
        self.insert(ids_by_row, np.arange(len(ids_by_row)))
