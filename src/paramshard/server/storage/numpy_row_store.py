"""The reference RowStore (row_store.py): rows in numpy arrays, ids in an IdIndex.

Rows live in row order in ``values`` (and the rule's ``slots``, ``steps``,
``last_seen`` alongside), grown by a quarter when full; ``index`` maps ids to
row numbers. Every operation is a few array operations over the batch.
Half-precision rows (row_formats.py) are numpy float16, or bfloat16 bits as
uint16, converted by row_formats' reference functions on the way in and out.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Mapping

import numpy as np

from paramshard.update_rules import Rule
from paramshard.server.storage.id_index import IdIndex
from paramshard.server.storage.row_formats import check_row_format, from_storage, rounding_words, storage_dtype, to_storage
from paramshard.server.storage.row_state import RowStateArrays
from paramshard.server.storage.row_store import distinct_sorted, lookup_or_create_in_parts, swap_plan

GROWTH = 1.25   # row storage grows by a quarter: little slack at 10^8 rows


def put_rows(table: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
    """table[rows] = values, with each row moved as one item (faster than fancy assignment)."""
    row_type = np.dtype((np.void, table.shape[1] * table.itemsize))
    np.put(table.view(row_type).reshape(-1), rows, np.ascontiguousarray(values).view(row_type).reshape(-1),
           mode="clip")


class NumpyRowStore(RowStateArrays):
    def __init__(self, dim: int, rule: Rule, keep_last_seen: bool, count_admissions: bool,
                 max_rows: int, capacity: int = 1024, value_dtype: str = "float32", rounding: str = "nearest",
                 seed: int = 0):
        check_row_format("row store", value_dtype, rounding)
        self.dim, self.rule, self.max_rows = dim, rule, max_rows
        self.value_dtype, self.rounding, self.seed = value_dtype, rounding, seed
        self._half = value_dtype != "float32"        # values held in numpy's float16, or bfloat16 bits
        self._slot_initials = rule.init_slots((1, dim))     # a new row's optimizer state
        self.slot_count = len(self._slot_initials)
        self.index = IdIndex(capacity)
        self._rows = 0
        self.values = np.empty((capacity, dim), storage_dtype(value_dtype))
        self.slots = rule.init_slots((capacity, dim))
        # Per-row update counts, kept only for rules that read them (Adam's bias correction).
        self.steps = np.zeros(capacity, np.uint32) if rule.uses_step else None
        self.last_seen = np.zeros(capacity, np.uint32) if keep_last_seen else None
        self.counts = IdIndex(16) if count_admissions else None   # ids seen but not admitted
        self.count_values = np.zeros(16, np.uint32)

    # -- size -------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        per_row = [a for a in (self.values, *self.slots, self.steps, self.last_seen) if a is not None]
        counts = self.counts.nbytes + self.count_values.nbytes if self.counts is not None else 0
        return sum(a.nbytes for a in per_row) + self.index.nbytes + counts

    def _ensure_capacity(self, rows: int) -> None:
        cap = len(self.values)
        if rows <= cap:
            return
        new_cap = min(max(rows, int(cap * GROWTH) + 1), max(rows, self.max_rows))

        def grow(a):
            b = np.empty((new_cap,) + a.shape[1:], a.dtype)
            b[:self._rows] = a[:self._rows]
            return b
        # Allocate everything before replacing anything: a MemoryError half way
        # must leave the table as it was, not with arrays of different lengths.
        values = grow(self.values)
        # Rows past num_rows stay untouched (their pages unmapped) until a row is created there
        # (create): reserving room costs address space, not memory.
        slots = [grow(s) for s in self.slots]
        steps = grow(self.steps) if self.steps is not None else None
        last_seen = grow(self.last_seen) if self.last_seen is not None else None
        self.values, self.slots, self.steps, self.last_seen = values, slots, steps, last_seen

    def reserve(self, rows: int) -> None:
        self._ensure_capacity(rows)
        self.index.reserve(rows)

    # -- rows -------------------------------------------------------------
    def lookup(self, ids: np.ndarray) -> np.ndarray:
        return self.index.lookup(ids)

    def create(self, ids: np.ndarray, values: np.ndarray, version: int,
               state: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        state = state or {}
        first, n = self._rows, len(ids)
        self._ensure_capacity(first + n)
        # Rows exist before their ids enter the index: if the insert fails, the index still
        # maps only ids that have rows (and num_rows did not move).
        rows = self.index.insert(ids)                  # rows first..first+n-1, in order
        new = slice(first, first + n)
        self.values[new] = to_storage(values, self.value_dtype)
        self._write_state(new, version, state)
        self._rows = first + n
        return rows

    def lookup_or_create(self, ids: np.ndarray, version: int, seed: int, init_scale: float) -> np.ndarray:
        return lookup_or_create_in_parts(self, ids, version, seed, init_scale)

    def gather(self, rows: np.ndarray) -> np.ndarray:
        values = np.take(self.values, rows, axis=0, mode="clip")     # clip: skips a bounds pass
        return from_storage(values, self.value_dtype) if self._half else values

    def set_values(self, rows: np.ndarray, values: np.ndarray) -> None:
        self.values[rows] = to_storage(values, self.value_dtype)

    def set_rule(self, rule: Rule) -> None:
        if type(rule) is not type(self.rule):
            raise ValueError(f"set_rule: {type(rule).__name__} keeps other state than {type(self.rule).__name__}")
        self.rule = rule

    def update(self, rows: np.ndarray, grads: np.ndarray, scale: float, version: int = 0) -> None:
        values = np.take(self.values, rows, axis=0, mode="clip")
        if self._half:
            values = from_storage(values, self.value_dtype)        # the maths is float32
        slots = [np.take(s, rows, axis=0, mode="clip") for s in self.slots]
        if self.steps is not None:
            steps = self.steps[rows] + 1
            self.steps[rows] = steps
            step = steps[:, None]
        else:
            step = 1
        self.rule.apply(values, grads, slots, step, scale=scale)
        if self._half:
            words = None
            if self.rounding == "stochastic":
                words = rounding_words(self.seed, self.index.ids_by_row()[rows], version, self.dim)
            values = to_storage(values, self.value_dtype, words)
        put_rows(self.values, rows, values)
        for s, new in zip(self.slots, slots):
            put_rows(s, rows, new)

    def touch(self, rows: np.ndarray, version: int) -> None:
        if self.last_seen is not None:
            self.last_seen[rows] = version

    # -- admission counters -----------------------------------------------
    def _counting(self) -> IdIndex:
        """The admission counters' index, for count(): SparseTable counts only in a store it made
        with count_admissions (its admission's min_count > 1)."""
        assert self.counts is not None, "admission counted in a row store made without counters"
        return self.counts

    def count(self, ids: np.ndarray) -> np.ndarray:
        counts = self._counting()
        rows = counts.lookup(ids)
        new = rows < 0
        if new.any():
            first = counts.size
            rows[new] = counts.insert(ids[new])
            if counts.size > len(self.count_values):
                self.count_values = np.resize(self.count_values, int(counts.size * GROWTH) + 16)
                self.count_values[first:] = 0
        self.count_values[rows] += 1
        return self.count_values[rows]

    def counted(self, ids: np.ndarray) -> np.ndarray:
        if self.counts is None:
            return np.zeros(len(ids), bool)
        return self.counts.lookup(ids) >= 0

    def restore_counts(self, ids: np.ndarray, counts: np.ndarray) -> None:
        if self.counts is None:
            return
        counted = self.counts.lookup(ids)
        new = counted < 0
        if new.any():
            self.counts.insert(ids[new])
            if self.counts.size > len(self.count_values):
                self.count_values = np.resize(self.count_values, self.counts.size + 16)
            counted = self.counts.lookup(ids)
        self.count_values[counted] = counts.astype(np.uint32)

    def counters(self) -> tuple[np.ndarray, np.ndarray] | None:
        if self.counts is None:
            return None
        return self.counts.ids_by_row().copy(), self.count_values[:self.counts.size].astype(np.int64)

    # -- eviction, export, snapshot ---------------------------------------
    def evict_unseen(self, before: int) -> int:
        # SparseTable evicts by age only from a store it made with keep_last_seen (its eviction policy).
        assert self.last_seen is not None, "eviction by age in a row store made without last-seen versions"
        stale = self.last_seen[:self._rows].astype(np.int64) < before
        if not stale.any():
            return 0
        return self._keep(np.flatnonzero(~stale))

    def drop(self, ids: np.ndarray) -> int:
        rows = self.lookup(ids)
        rows = distinct_sorted(rows[rows >= 0])
        if not len(rows):
            return 0
        holes, movers, left = swap_plan(rows, self._rows)
        self.index.delete(rows)
        for a in (self.values, *self.slots, self.steps, self.last_seen):
            if a is not None:
                a[holes] = a[movers]
        self.index.move_rows(movers, holes, left)
        self._rows = left
        return len(rows)

    def _keep(self, kept: np.ndarray) -> int:
        """Keep rows ``kept`` (ascending), in that order; how many went."""
        ids_by_row = self.ids()
        evicted = self._rows - len(kept)
        self._rows = len(kept)
        self.values[:len(kept)] = self.values[kept]
        for s in self.slots:
            s[:len(kept)] = s[kept]
        if self.steps is not None:
            self.steps[:len(kept)] = self.steps[kept]
        if self.last_seen is not None:
            self.last_seen[:len(kept)] = self.last_seen[kept]
        self.index.rebuild(ids_by_row[kept])
        return evicted

    def ids(self, start: int = 0, count: int | None = None) -> np.ndarray:
        end = self._rows if count is None else min(self._rows, start + count)
        return self.index.ids_by_row()[start:max(start, end)].copy()

    def page(self, start: int, count: int) -> dict[str, np.ndarray]:
        end = min(self._rows, start + count)
        rows = slice(start, max(start, end))
        out = {"ids": self.index.ids_by_row()[rows].copy(),
               "values": from_storage(self.values[rows], self.value_dtype) if self._half else self.values[rows].copy()}
        out.update(self._state_page(rows))
        return out

    def clear(self) -> None:
        NumpyRowStore.__init__(self, self.dim, self.rule, self.last_seen is not None, self.counts is not None,
                      self.max_rows, capacity=len(self.values), value_dtype=self.value_dtype,
                      rounding=self.rounding, seed=self.seed)


if TYPE_CHECKING:   # `make typecheck` checks the contract: RowStore (server/storage/row_store.py)
    from paramshard.server.storage.row_store import RowStore
    _row_store: type[RowStore] = NumpyRowStore
