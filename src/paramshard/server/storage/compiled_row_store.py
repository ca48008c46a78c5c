"""The compiled RowStore (row_store.py): numba kernels over rows reserved as address space.

What the numpy store does with batch-sized temporaries, this one does in one
pass of compiled code (server/storage/kernels/): a first touch finds or makes every row
of a pull in one loop (initial values written in place), a push updates each
row where it lives, and the id index grows a slice at a time instead of
rehashing the table. The row arrays are mappings sized to the rows held, with
room to double (kernels/arena.py): growing moves their pages, never copies the
rows, and checks the process's address-space limit first, so a table too large
for it is refused (OutOfAddressSpace) with the store left as it was.

Half-precision rows (row_formats.py) are uint16 bits converted in the kernels
(kernels/half.py): 2 bytes a value.

It is the numpy store's twin, not its rival: the same calls give
bit-identical rows, state and handles (tests/unit/server/storage/test_row_store.py runs both
against the dict reference store; tests/unit/test_compiled_row_store.py
against each other).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

import numpy as np

from paramshard.errors import OutOfAddressSpace
from paramshard.update_rules import Rule
from paramshard.server.storage.kernels import arena
from paramshard.server.storage.kernels.half import from_bits, to_bits
from paramshard.server.storage.kernels.hash_index import DRAIN_PER_INSERT, MAX_LOAD, HashIndex, buckets_for
from paramshard.server.storage.kernels.initial_rows import seed_salt
from paramshard.server.storage.kernels.row_kernels import compact_kernel, first_touch_kernel, gather_kernel, kept_rows_kernel
from paramshard.server.storage.kernels.update_kernels import rule_kernel
from paramshard.server.storage.row_state import RowStateArrays
from paramshard.server.storage.row_formats import STOCHASTIC, check_row_format, code_of, round_salt, version_key
from paramshard.server.storage.row_store import distinct_sorted, swap_plan

COUNTER_ROWS = 1 << 31     # admission counters: ids seen but not admitted, at most
_loaded: set[tuple] = set()    # (rule, eviction, admission counting, half rows) whose kernels are loaded here


class CompiledRowStore(RowStateArrays):
    def __init__(self, dim: int, rule: Rule, keep_last_seen: bool, count_admissions: bool,
                 max_rows: int, capacity: int = 1024, value_dtype: str = "float32", rounding: str = "nearest",
                 seed: int = 0, _probe: bool = False):
        check_row_format("row store", value_dtype, rounding)
        self.dim, self.rule, self.max_rows = dim, rule, max_rows
        self.value_dtype, self.rounding, self.seed = value_dtype, rounding, seed
        # Half rows are uint16 bits (kernels/half.py); the kernels convert by this code.
        self._fmt = code_of(value_dtype, rounding)
        self._half = value_dtype != "float32"
        self._salt = round_salt(seed)
        self._scratch = np.empty(dim, np.float32)          # a float32 row, for half first touches
        self._keep_last_seen, self._count_admissions, self._capacity = keep_last_seen, count_admissions, capacity
        self._slot_initials = rule.init_slots((1, dim))      # a new row's optimizer state
        self.slot_count = len(self._slot_initials)
        self._update = rule_kernel(rule)
        self._rows = 0
        self._label = getattr(self, "_label", "a row store")     # kept by clear()
        # Room for ``capacity`` rows to start with; the arrays grow as rows come (_ensure_capacity).
        start, what = min(max(capacity, 16), max(max_rows, 16)), self._label
        self.keys = arena.reserve(start, (), np.uint64, what=what)
        self.values = arena.reserve(start, (dim,), np.uint16 if self._half else np.float32, what=what)
        self.slots = [arena.reserve(start, s.shape[1:], np.float32, what=what) for s in self._slot_initials]
        self.steps = arena.reserve(start, (), np.uint32, what=what) if rule.uses_step else None
        self.last_seen = arena.reserve(start, (), np.uint32, what=what) if keep_last_seen else None
        self.index = HashIndex(capacity)
        self.index.label = what
        if count_admissions:
            self.count_keys = arena.reserve(1024, (), np.uint64, what=what)
            self.count_values = arena.reserve(1024, (), np.uint32, what=what)
            self.count_index: HashIndex | None = HashIndex(16)
            self.count_index.label = what
            self._counted = 0
        else:
            self.count_index = None
        if not _probe:
            self._load_kernels()

    def _load_kernels(self) -> None:
        """Load every kernel this store will use now, from numba's cache (compiled by `make
        warm`): about 0.5 s a process, paid when a table is registered instead of by the
        first pulls, and by the first growth (measured: 0.7 s and 0.5 s)."""
        key = (type(self.rule), self._keep_last_seen, self._count_admissions, self._half)
        if key in _loaded:
            return
        from paramshard.server.storage.kernels.warm import exercise
        exercise(CompiledRowStore(self.dim, self.rule, self._keep_last_seen, self._count_admissions,
                                  max_rows=1 << 16, capacity=16, value_dtype=self.value_dtype,
                                  rounding=self.rounding, _probe=True))
        _loaded.add(key)

    # -- size -------------------------------------------------------------

    def _per_row_arrays(self) -> list[np.ndarray]:
        return [a for a in (self.keys, self.values, *self.slots, self.steps, self.last_seen) if a is not None]

    @property
    def bytes_per_row(self) -> int:
        """Bytes a row occupies in the arrays (the index comes on top: 10.7-21.3 bytes a row): the id
        (8), the values (4 or, half rows, 2 a column), the rule's state, update counts and last-seen
        versions (4 each, when kept)."""
        return sum(a.strides[0] for a in self._per_row_arrays())

    @property
    def nbytes(self) -> int:
        counters = 0
        if self.count_index is not None:
            counters = self._counted * 12 + self.count_index.nbytes
        return self._rows * self.bytes_per_row + self.index.nbytes + counters

    @property
    def label(self) -> str:
        """What the store's errors call it (SparseTable sets "table 'name'")."""
        return self._label

    @label.setter
    def label(self, text: str) -> None:
        self._label = self.index.label = text
        if self.count_index is not None:
            self.count_index.label = text

    def _room_rows(self) -> int:
        """Rows the arrays have room for: the ids' (a tiered store's grow alone) and the values'
        (grown last) the shortest."""
        return min(len(self.keys), len(self.values))

    def _ensure_capacity(self, rows: int, exact: bool = False) -> None:
        """Room for ``rows`` rows: the arrays grow to twice their rows (``exact``: to ``rows``), within
        the row limit and the address-space limit (kernels/arena.py). Rows never move in memory
        (their pages do, when a mapping cannot grow in place)."""
        if rows <= len(self.values):
            return
        if rows > self.max_rows:
            raise MemoryError(f"{self._label}: {rows} rows: past the {self.max_rows} this store holds")
        target = rows if exact else min(self.max_rows, max(rows, 2 * len(self.values)))
        self._grow_arrays(target, rows)

    def _room_for(self, rows: int, index_rows: int = 0) -> int:
        """Address space growing every per-row array to ``rows`` rows (and the id index to
        buckets for ``index_rows`` ids) may take."""
        need = sum(arena.room_needed(a, rows) for a in self._per_row_arrays())
        return need + (buckets_for(index_rows, MAX_LOAD) * 8 if index_rows else 0)

    def _grow_arrays(self, target: int, rows: int) -> None:
        """Grow every per-row array to ``target`` rows, or, where that does not fit the address-space
        limit, to the ``rows`` needed; checked for all of them before any grows."""
        try:
            arena.check_room(self._room_for(target), self._label, target)
        except OutOfAddressSpace:
            if target == rows:
                raise
            arena.check_room(self._room_for(rows), self._label, rows)
            target = rows
        def grow(a):     # unannotated: the checker takes each optional array's type as it is
            return None if a is None else arena.grow(a, target, self._rows, self._label)

        # ``values`` last: its length is the store's capacity, so a failure half way (a mapping
        # refused after the check passed) leaves a store whose other arrays are only larger.
        self.keys = grow(self.keys)
        self.slots = [grow(s) for s in self.slots]
        self.steps, self.last_seen = grow(self.steps), grow(self.last_seen)
        self.values = grow(self.values)

    def reserve(self, rows: int) -> None:
        if rows > len(self.values) and rows <= self.max_rows:
            # The rows and their index buckets, checked at once: a table reserved larger than the
            # address space allows is refused before anything is made.
            arena.check_room(self._room_for(rows, rows), self._label, rows)
        self._ensure_capacity(rows, exact=True)
        self.index.reserve(self.keys, rows, self._rows)

    # -- rows -------------------------------------------------------------
    def lookup(self, ids: np.ndarray) -> np.ndarray:
        return self.index.lookup(self.keys, np.ascontiguousarray(ids, np.uint64))

    def _init_state(self, first: int, n: int, version: int, state: Mapping[str, np.ndarray]) -> None:
        self._write_state(slice(first, first + n), version, state)

    def create(self, ids: np.ndarray, values: np.ndarray, version: int,
               state: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        first, n = self._rows, len(ids)
        self._ensure_capacity(first + n)
        self.index.make_room(self.keys, first, n)       # allocates, if at all, before any change
        # Rows past num_rows are invisible: written first, then indexed, then counted.
        self.keys[first:first + n] = ids
        self.values[first:first + n] = self._stored(values)
        self._init_state(first, n, version, state or {})
        self.index.insert(self.keys, first, n)
        self._rows = first + n
        self.index.prepare(self._rows, n)
        return np.arange(first, first + n)

    def lookup_or_create(self, ids: np.ndarray, version: int, seed: int, init_scale: float) -> np.ndarray:
        ids = np.ascontiguousarray(ids, np.uint64)
        first = self._rows
        if min(self.index.room(first), self._room_rows() - first) < len(ids):
            # Room for every id to be new, made before any row is: a MemoryError leaves the store
            # as it was. (Only within a batch of the next growth: then it comes a little early.)
            self._ensure_capacity(first + len(ids))
            self.index.make_room(self.keys, first, len(ids))
        else:
            self.index.drain(self.keys, 0)
        rows = np.empty(len(ids), np.int64)
        room = min(self.index.room(first), self._room_rows() - first)
        made, done = first_touch_kernel(self.index.buckets, self.index.old, self.keys, self.values, ids, 0, first,
                                        room, seed_salt(seed), np.float32(2 * init_scale), np.float32(init_scale), rows,
                                        self._scratch, self._fmt)
        if made:
            self._init_state(first, made, version, {})
            self._rows = first + made
            self.index.drain(self.keys, DRAIN_PER_INSERT * made)
            self.index.prepare(self._rows, made)
        assert done == len(ids), "first touch ran out of the room it was given"
        return rows

    def gather(self, rows: np.ndarray) -> np.ndarray:
        out = np.empty((len(rows), self.dim), np.float32)
        gather_kernel(self.values, np.ascontiguousarray(rows, np.int64), out, self._fmt)
        return out

    def _stored(self, values: np.ndarray) -> np.ndarray:
        """float32 values as the rows hold them (half: rounded to nearest)."""
        return to_bits(values, self._fmt) if self._half else values

    def set_values(self, rows: np.ndarray, values: np.ndarray) -> None:
        self.values[rows] = self._stored(values)

    def set_rule(self, rule: Rule) -> None:
        if type(rule) is not type(self.rule):
            raise ValueError(f"set_rule: {type(rule).__name__} keeps other state than {type(self.rule).__name__}")
        self._update = rule_kernel(rule)     # reads the rule's settings (the rate) when made
        self.rule = rule

    def update(self, rows: np.ndarray, grads: np.ndarray, scale: float, version: int = 0) -> None:
        if self._fmt & STOCHASTIC:
            self._update(self.values, self.slots, self.steps, np.ascontiguousarray(rows, np.int64),
                         np.ascontiguousarray(grads, np.float32), scale, self.keys, self._fmt, self._salt,
                         version_key(version))
        elif self._half:
            self._update(self.values, self.slots, self.steps, np.ascontiguousarray(rows, np.int64),
                         np.ascontiguousarray(grads, np.float32), scale, fmt=self._fmt)
        else:
            self._update(self.values, self.slots, self.steps, np.ascontiguousarray(rows, np.int64),
                         np.ascontiguousarray(grads, np.float32), scale)

    def touch(self, rows: np.ndarray, version: int) -> None:
        if self.last_seen is not None:
            self.last_seen[rows] = version

    # -- admission counters -----------------------------------------------
    def _counting(self) -> HashIndex:
        """The admission counters' index, for count(): SparseTable counts only in a store it made
        with count_admissions (its admission's min_count > 1)."""
        assert self.count_index is not None, f"{self._label}: admission counted in a store made without counters"
        return self.count_index

    def count(self, ids: np.ndarray) -> np.ndarray:
        ids = np.ascontiguousarray(ids, np.uint64)
        rows = self._counting().lookup(self.count_keys, ids)
        new = np.flatnonzero(rows < 0)
        if len(new):
            rows[new] = self._add_counters(ids[new])
        self.count_values[rows] += 1
        return self.count_values[rows]

    def _add_counters(self, ids: np.ndarray) -> np.ndarray:
        first, n = self._counted, len(ids)
        if first + n > COUNTER_ROWS:
            raise MemoryError(f"{self._label}: admission counters: {first + n} ids seen and not admitted, "
                              f"past the {COUNTER_ROWS} this store holds")
        if first + n > len(self.count_keys):
            target = min(COUNTER_ROWS, max(first + n, 2 * len(self.count_keys)))
            what = f"{self._label}: admission counters"
            arena.check_room(arena.room_needed(self.count_keys, target) +
                             arena.room_needed(self.count_values, target), what, target)
            self.count_values = arena.grow(self.count_values, target, first, what)
            self.count_keys = arena.grow(self.count_keys, target, first, what)
        index = self._counting()
        index.make_room(self.count_keys, first, n)
        self.count_keys[first:first + n] = ids
        self.count_values[first:first + n] = 0
        index.insert(self.count_keys, first, n)
        self._counted = first + n
        return np.arange(first, first + n)

    def counted(self, ids: np.ndarray) -> np.ndarray:
        if self.count_index is None:
            return np.zeros(len(ids), bool)
        return self.count_index.lookup(self.count_keys, np.ascontiguousarray(ids, np.uint64)) >= 0

    def restore_counts(self, ids: np.ndarray, counts: np.ndarray) -> None:
        if self.count_index is None:
            return
        ids = np.ascontiguousarray(ids, np.uint64)
        rows = self.count_index.lookup(self.count_keys, ids)
        new = np.flatnonzero(rows < 0)
        if len(new):
            rows[new] = self._add_counters(ids[new])
        self.count_values[rows] = counts.astype(np.uint32)

    def counters(self) -> tuple[np.ndarray, np.ndarray] | None:
        if self.count_index is None:
            return None
        return self.count_keys[:self._counted].copy(), self.count_values[:self._counted].astype(np.int64)

    # -- eviction, export, snapshot ---------------------------------------
    def evict_unseen(self, before: int) -> int:
        return self._keep(kept_rows_kernel(self.last_seen, self._rows, before))

    def drop(self, ids: np.ndarray) -> int:
        rows = self.lookup(ids)
        rows = distinct_sorted(rows[rows >= 0])
        if not len(rows):
            return 0
        holes, movers, left = swap_plan(rows, self._rows)
        self.index.delete(self.keys, rows)          # before the ids under them are overwritten
        for a in self._per_row_arrays():
            a[holes] = a[movers]
        self.index.repoint(self.keys, movers, holes)
        self._rows = left
        for a in self._per_row_arrays():
            arena.release(a, left)
        return len(rows)

    def _keep(self, kept: np.ndarray) -> int:
        """Keep rows ``kept`` (ascending), in that order; how many went."""
        evicted = self._rows - len(kept)
        if not evicted:
            return 0
        for a in self._per_row_arrays():
            compact_kernel(a, kept)
            arena.release(a, len(kept))
        self._rows = len(kept)
        self.index.rebuild(self.keys, self._rows)
        return evicted

    def ids(self, start: int = 0, count: int | None = None) -> np.ndarray:
        end = self._rows if count is None else min(self._rows, start + count)
        return self.keys[start:max(start, end)].copy()

    def page(self, start: int, count: int) -> dict[str, np.ndarray]:
        end = min(self._rows, start + count)
        rows = slice(start, max(start, end))
        out = {"ids": self.keys[rows].copy(),
               "values": from_bits(self.values[rows], self._fmt) if self._half else self.values[rows].copy()}
        out.update(self._state_page(rows))
        return out

    def clear(self) -> None:
        # This class's arrays and counters made anew; a subclass with more to remake overrides
        # clear (TieredRowStore: its files).
        CompiledRowStore.__init__(self, self.dim, self.rule, self._keep_last_seen, self._count_admissions,
                                  self.max_rows, capacity=self._capacity, value_dtype=self.value_dtype,
                                  rounding=self.rounding, seed=self.seed, _probe=True)


if TYPE_CHECKING:   # `make typecheck` checks the contract: RowStore (server/storage/row_store.py)
    from paramshard.server.storage.row_store import RowStore
    _row_store: type[RowStore] = CompiledRowStore
