"""The compiled row store with a memory budget: hot rows in RAM, cold ones in a file tier.

``SparseEmbedding(..., memory_budget="4GB")`` (or a server's
PARAMSHARD_MEMORY_BUDGET) makes a table's store a ``TieredRowStore``: the
CompiledRowStore (compiled_row_store.py) whose per-row arrays of values,
optimizer slots, update counts and last-seen versions are MAP_SHARED mappings
of sparse scratch files in a tier directory (kernels/arena.py
``reserve_file``) instead of anonymous memory. Everything above the row
handles is unchanged: the same calls give the same rows, state and handles,
bit for bit (tests/unit/server/storage/test_tiered_row_store.py runs it against an unbounded
store). The ids and their index stay in RAM: the index reads ids on every
lookup and while it grows, so tiering them would fault pages back behind the
budget's back; they are counted against the budget as a fixed part.

Residency is kept per region: the rows on whole 64 KiB blocks of the values
array (the kernel's fault-around window: a read fault maps the 16 pages around
it, and arena.reserve_file aligns row 0 so a window never reaches into another
region). Every call that touches rows stamps their regions (kernels/tier_kernels.py)
with a clock and warms them (heat: pieces of calls that touched them, halved
every AGE_PIECES), and counts hits (region resident) and misses; a spilled region
touched is promoted (its pages come back by page fault, from the page cache or
the file). When the resident estimate (the fixed part plus resident regions x
region bytes) passes the budget, the coldest regions (least heat, then oldest
stamp: the Zipf tail's one-off rows go before the rows that keep coming back)
are spilled, MADV_DONTNEED on each array's range of them, until it is under
TARGET of the budget. For a MAP_SHARED file mapping that drops the pages from
the process, not the data: it stays in the page cache (reclaimable once written
back) and the file. Calls run in pieces: a piece ends where its promotions would
take more than the budget has room for, new rows come at most ~1% of the budget
at a time, and the budget is enforced after each piece, so RSS stays within it
during a call too. A server budget (``ServerBudget``) reads the process's RSS
after each piece instead and spills the coldest regions across all its tables.

The files are scratch, never the durable copy (checkpoints are): they are
removed when the store is cleared, closed or collected, and at exit.
"""
from __future__ import annotations

import ctypes
import math
import mmap
import os
import shutil
import tempfile
import weakref
from pathlib import Path

import numpy as np
from typing import TYPE_CHECKING


from paramshard.budgets import show_bytes
from paramshard.log import get_logger
from paramshard.server.storage.compiled_row_store import CompiledRowStore
from paramshard.server.storage.kernels import arena
from paramshard.server.storage.kernels.row_kernels import compact_kernel, kept_rows_kernel
from paramshard.server.storage.kernels.tier_kernels import compact_range_kernel, stamp_kernel, stamp_range_kernel
from paramshard.server.storage.tier_space import TierSpace

log = get_logger("tier")

REGION_VALUE_BYTES = 64 << 10    # a region holds at least this much of the values array, whole pages
TARGET = 0.95                    # a budget passed is enforced down to this share of it
MIN_CHUNK, MAX_CHUNK = 64, 65536     # rows per piece of a large call
AGE_PIECES = 256                 # every this many pieces stamped, every region's heat is halved
CLOCK_LIMIT = (1 << 32) - 2      # stamps are uint32: past this the clock starts again
_PAGE = arena.PAGE
_DONTNEED = mmap.MADV_DONTNEED
_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_libc.madvise.restype = ctypes.c_int


def _madvise(address: int, length: int, advice: int) -> None:
    if _libc.madvise(address, length, advice) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"madvise: {os.strerror(err)}")


# -- the clock: one tick per piece of a call, shared by every tiered store of the process ---------------
class _Clock:
    def __init__(self):
        self.now = 0
        self.stores: weakref.WeakSet = weakref.WeakSet()

    def tick(self) -> int:
        self.now += 1
        if self.now >= CLOCK_LIMIT:         # once in 4 billion calls: every stamp starts over, equal
            for store in list(self.stores):
                store._stamps[:] = 0
                store._promoted_at[:] = 0
            self.now = 1
        return self.now


CLOCK = _Clock()


def process_rss() -> int:
    """Resident bytes of this process (/proc/self/statm: a few microseconds); 0 where there is none."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


class ServerBudget:
    """A whole server's budget: after each piece of a call to one of its tiered stores, the
    process's RSS is read; past the budget, the coldest regions of all its stores are spilled
    until it is under TARGET of it (or nothing is left to spill)."""

    def __init__(self, budget: int):
        self.budget = budget
        self.stores: weakref.WeakSet = weakref.WeakSet()
        self.spills = 0
        self.max_rss = 0
        self.last_rss = 0
        self._warned = False

    def add(self, store: "TieredRowStore") -> None:
        self.stores.add(store)

    def enforce(self) -> None:
        rss = self.last_rss = process_rss()
        self.max_rss = max(self.max_rss, rss)
        if rss <= self.budget:
            return
        target = int(TARGET * self.budget)
        for _ in range(16):
            stores = [s for s in self.stores if not s.closed]
            parts = [(s, *s.resident_regions()) for s in stores]
            parts = [p for p in parts if len(p[1])]
            if not parts:
                break
            stamps = np.concatenate([p[2] for p in parts])
            owner = np.concatenate([np.full(len(p[1]), i, np.int64) for i, p in enumerate(parts)])
            region = np.concatenate([p[1] for p in parts])
            size = np.array([p[0].region_bytes for p in parts], np.int64)[owner]
            order = np.argsort(stamps, kind="stable")
            freed = np.cumsum(size[order])
            take = order[:int(np.searchsorted(freed, rss - target)) + 1]
            for i, (store, _, _) in enumerate(parts):
                mine = np.sort(region[take[owner[take] == i]])
                if len(mine):
                    self.spills += store.spill(mine)
            rss = self.last_rss = process_rss()
            if rss <= target:
                return
        if not self._warned and rss > self.budget:
            self._warned = True
            log.warning("memory budget %s: the process holds %s with every tiered row spilled (ids, "
                        "indexes, other state and the program itself); the budget cannot be kept",
                        show_bytes(self.budget), show_bytes(rss))


def _remove_files(paths: list[str], directory: str | None, own: bool = False) -> None:
    """Remove the files, then ``directory``: all of it when the store made it (``own``), else
    only if nothing else is left in it."""
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass
    if directory is not None and own:
        shutil.rmtree(directory, ignore_errors=True)
    elif directory is not None:
        try:
            os.rmdir(directory)
        except OSError:
            pass


class TieredRowStore(CompiledRowStore):
    """A CompiledRowStore whose rows live in files, kept in RAM within ``memory_budget`` bytes
    (the table's; None: only the server's, ``server_budget``)."""
    takes_budgets = True

    def __init__(self, dim, rule, keep_last_seen: bool, count_admissions: bool, max_rows: int,
                 capacity: int = 1024, value_dtype: str = "float32", rounding: str = "nearest", seed: int = 0,
                 _probe: bool = False, *, memory_budget: int | None = None,
                 tier_dir: str | os.PathLike | None = None, server_budget: ServerBudget | None = None,
                 table_name: str | None = None):
        self.memory_budget, self.server_budget = memory_budget, server_budget
        self.table_name = table_name        # for errors: a full disk names the table (tier_space.py)
        self.closed = False
        self._warned = False
        self._own_dir = tier_dir is None
        self.tier_dir = Path(tempfile.mkdtemp(prefix=f"paramshard-tier-{os.getpid()}-")) if tier_dir is None else Path(tier_dir)
        self.tier_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._files: list[str] = []
        self._finalizer = weakref.finalize(self, _remove_files, self._files, str(self.tier_dir), self._own_dir)
        self.hits = self.misses = self.promotions = self.spills = 0
        self._build(dim, rule, keep_last_seen, count_admissions, max_rows, capacity,
                    dict(value_dtype=value_dtype, rounding=rounding, seed=seed), _probe)
        CLOCK.stores.add(self)
        if server_budget is not None:
            server_budget.add(self)
        if not _probe:
            _load_tier_kernels()

    def _build(self, dim, rule, keep_last_seen, count_admissions, max_rows, capacity, row_format: dict,
               probe: bool) -> None:
        """The compiled store's arrays, then each per-row array but the ids moved into a file (same
        shapes and types: float32 or half rows alike)."""
        CompiledRowStore.__init__(self, dim, rule, keep_last_seen, count_admissions, max_rows, capacity,
                                  **row_format, _probe=probe)
        _remove_files(self._files, None)       # a clear: the old files go (a mapping keeps its own)
        self._files.clear()
        moved = {}
        for name, array in self._named_tier_arrays():
            path = str(self.tier_dir / f"{name}.rows")
            self._files.append(path)
            moved[name] = arena.reserve_file(path, max_rows, array.shape[1:], array.dtype, minimum=16)
        self.values = moved["values"]
        self.slots = [moved[f"slot{i}"] for i in range(len(self.slots))]
        if self.steps is not None:
            self.steps = moved["steps"]
        if self.last_seen is not None:
            self.last_seen = moved["last_seen"]
        # A region is whole FILE_ALIGN blocks of the values array (reserve_file aligns row 0), so
        # the kernel's fault-around never maps pages of another region than the one read.
        stride = self.values.strides[0]
        rows = 1 << math.ceil(math.log2(max(1, -(-REGION_VALUE_BYTES // stride))))
        while (rows * stride) % max(_PAGE, min(arena.FILE_ALIGN, REGION_VALUE_BYTES)):
            rows *= 2
        self._shift = rows.bit_length() - 1
        self.region_rows = rows
        # Arrays whose region is whole pages spill with it; the thin ones (update counts, last-seen
        # versions, a row-wise accumulator: 4 bytes a row) spill only the pages a run of spilled
        # regions covers, so they are counted as staying in RAM, with the ids.
        strides = [a.strides[0] for a in self._tier_arrays()]
        whole = max(_PAGE, min(arena.FILE_ALIGN, REGION_VALUE_BYTES))
        self.region_bytes = rows * sum(s for s in strides if (rows * s) % whole == 0)
        self._thin_bytes = sum(s for s in strides if (rows * s) % whole)
        regions = -(-len(self.values) // rows)
        self._stamps = np.zeros(regions, np.uint32)
        self._heat = np.zeros(regions, np.uint32)
        self._promoted_at = np.zeros(regions, np.uint32)
        self._spilled = np.zeros(regions, np.uint8)
        self._spilled_count = 0
        self._pieces_stamped = 0
        # Where each array's row 0 is, for madvise by address (spills are many: no per-call lookups).
        self._spans = [(a.ctypes.data, a.strides[0]) for a in self._tier_arrays()]
        # Disk for rows is taken before they are written (a write into a hole of a full disk is a SIGBUS).
        self._space = TierSpace(list(self._named_tier_arrays()), self.tier_dir, self.table_name, self.region_rows)
        # New rows come in pieces of at most ~1% of the budget (a piece is enforced after it is made).
        budget = self.memory_budget or (self.server_budget.budget if self.server_budget else 1 << 30)
        self._chunk = int(min(MAX_CHUNK, max(MIN_CHUNK, budget // 100 // self.bytes_per_row)))

    def _named_tier_arrays(self):
        yield "values", self.values
        yield from ((f"slot{i}", s) for i, s in enumerate(self.slots))
        if self.steps is not None:
            yield "steps", self.steps
        if self.last_seen is not None:
            yield "last_seen", self.last_seen

    def _tier_arrays(self) -> list[np.ndarray]:
        return [a for _, a in self._named_tier_arrays()]

    # -- residency --------------------------------------------------------------------------------
    @property
    def regions_in_use(self) -> int:
        return -(-self._rows // self.region_rows)

    @property
    def fixed_bytes(self) -> int:
        """What stays in RAM whatever the budget: the ids, their index, the admission counters (and,
        counted as staying, the thin per-row arrays)."""
        counters = 0 if self.count_index is None else self._counted * 12 + self.count_index.nbytes
        return self._rows * (self.keys.strides[0] + self._thin_bytes) + self.index.nbytes + counters

    @property
    def resident_bytes(self) -> int:
        """The resident estimate: the fixed part and every region not spilled, whole (a region
        promoted by one row counts all its pages: an estimate from above)."""
        return self.fixed_bytes + (self.regions_in_use - self._spilled_count) * self.region_bytes

    def resident_regions(self) -> tuple[np.ndarray, np.ndarray]:
        """(regions resident, their coldness keys: the lowest spills first). The key is the
        region's heat, then its stamp: rarely used regions go first, and of those the least
        recently used. (Plain LRU would keep the regions of ids just seen once, the Zipf tail,
        and spill the ones whose rows come back every few batches.)"""
        regions = np.flatnonzero(self._spilled[:self.regions_in_use] == 0)
        keys = (self._heat[regions].astype(np.int64) << 32) | self._stamps[regions].astype(np.int64)
        return regions, keys

    def spill(self, regions: np.ndarray) -> int:
        """Drop the pages of ``regions`` (sorted, resident) from the process; how many."""
        if not len(regions):
            return 0
        cuts = np.flatnonzero(np.diff(regions) != 1) + 1
        firsts = regions[np.concatenate(([0], cuts))].tolist()
        lasts = regions[np.concatenate((cuts - 1, [len(regions) - 1]))].tolist()
        shift = self._shift
        for address, stride in self._spans:
            for first, last in zip(firsts, lasts):
                start = -(-(address + (first << shift) * stride) // _PAGE) * _PAGE
                end = (address + ((last + 1) << shift) * stride) // _PAGE * _PAGE
                if end > start:
                    _madvise(start, end - start, _DONTNEED)
        self._spilled[regions] = 1
        self._spilled_count += len(regions)
        self.spills += len(regions)
        return len(regions)

    def spill_coldest(self, count: int) -> int:
        regions, keys = self.resident_regions()
        if count < len(regions):
            regions = np.sort(regions[np.argpartition(keys, count - 1)[:count]])
        return self.spill(regions)

    def _enforce(self) -> None:
        if self.memory_budget is not None and not self._warned and self.fixed_bytes > self.memory_budget:
            self._warned = True
            log.warning("memory budget %s of a table: its ids and their index alone take %s (%.0f bytes a row); "
                        "every row is spilled and read back from the file tier on each access",
                        show_bytes(self.memory_budget), show_bytes(self.fixed_bytes),
                        self.fixed_bytes / max(1, self._rows))
        if self.memory_budget is not None:
            over = self.resident_bytes - TARGET * self.memory_budget
            if self.resident_bytes > self.memory_budget and over > 0:
                self.spill_coldest(int(math.ceil(over / self.region_bytes)))
        if self.server_budget is not None:
            self.server_budget.enforce()

    def _promotion_room(self) -> int:
        """Regions a piece may bring back and stay within the budget(s) (at least one)."""
        room = MAX_CHUNK
        if self.memory_budget is not None:
            room = (self.memory_budget - self.resident_bytes) // self.region_bytes
        if self.server_budget is not None:
            room = min(room, (self.server_budget.budget - self.server_budget.last_rss) // self.region_bytes)
        return max(1, int(room))

    def _stamped(self, rows: np.ndarray):
        """Pieces (start, end) of ``rows``, each stamped before it is yielded and enforced after it
        is done: a piece ends where its promotions would pass what the budget has room for."""
        n, start = len(rows), 0
        while start < n:
            end, hits, misses, promotions = stamp_kernel(
                rows, start, min(n, start + MAX_CHUNK), self._shift, self._stamps, self._heat, self._spilled,
                self._promoted_at, CLOCK.tick(), self._promotion_room())
            self.hits += hits
            self.misses += misses
            self.promotions += promotions
            self._spilled_count -= promotions
            self._age()
            yield start, end
            self._enforce()
            start = end

    def _age(self) -> None:
        self._pieces_stamped += 1
        if self._pieces_stamped % AGE_PIECES == 0:
            self._heat[:self.regions_in_use] >>= 1

    def _stamp_new(self, first: int, end: int) -> None:
        back = stamp_range_kernel(first, end, self._shift, self._stamps, self._heat, self._spilled, CLOCK.tick())
        self.promotions += back
        self._spilled_count -= back

    def _pieces(self, n: int):
        return ((s, min(n, s + self._chunk)) for s in range(0, n, self._chunk))

    def tier_stats(self) -> dict:
        return {"budget": self.memory_budget or 0, "resident_bytes": self.resident_bytes, "hits": self.hits,
                "misses": self.misses, "spills": self.spills, "promotions": self.promotions}

    # -- capacity -----------------------------------------------------------------------------------
    def _ensure_capacity(self, rows: int, exact: bool = False) -> None:
        """The files are reserved once, for the row limit; only the ids (in RAM) grow (kernels/arena.py)."""
        if rows <= min(len(self.keys), len(self.values)):
            return
        if rows > self.max_rows:
            raise MemoryError(f"{rows} rows: past the {self.max_rows} this store holds")
        room = min(len(a) for a in self._tier_arrays())
        if rows > room:
            raise MemoryError(f"{rows} rows: past the {room} the tier files in {self.tier_dir} were made for")
        self.keys = arena.grow(self.keys, min(self.max_rows, max(rows, 2 * len(self.keys))), self._rows,
                               self._label)

    # -- rows: the compiled store's calls, a piece at a time, stamped and enforced -------------------------
    def create(self, ids, values, version, state=None):
        n = len(ids)
        if n <= self._chunk:
            first = self._rows
            self._space.ensure(first + n)
            made = super().create(ids, values, version, state)
            self._stamp_new(first, self._rows)
            self._enforce()
            return made
        self.reserve(self._rows + n)        # every allocation before the first row: all or nothing stays
        self._space.ensure(self._rows + n)
        state = state or {}
        out = np.empty(n, np.int64)
        for s, e in self._pieces(n):
            first = self._rows
            out[s:e] = super().create(ids[s:e], values[s:e], version, {k: v[s:e] for k, v in state.items()})
            self._stamp_new(first, self._rows)
            self._enforce()
        return out

    def lookup_or_create(self, ids, version, seed, init_scale):
        # In pieces, the same rows: new ids get rows in the order they first appear either way.
        ids = np.ascontiguousarray(ids, np.uint64)
        out = np.empty(len(ids), np.int64)
        self._ensure_space(ids)            # all or nothing: a full disk makes none of the rows
        for s, e in self._pieces(len(ids)):
            first = self._rows
            out[s:e] = super().lookup_or_create(ids[s:e], version, seed, init_scale)
            self._stamp_new(first, self._rows)
            self._enforce()
        return out

    def _ensure_space(self, ids: np.ndarray) -> None:
        """Disk for every row ``ids`` may make, before any is made; near the edge of what is
        reserved, only for the ids not yet held (a full disk still serves the rows it has)."""
        if self._rows + len(ids) > self._space.reserved:
            missing = ids[self.lookup(ids) < 0]
            self._space.ensure(self._rows + len(np.unique(missing)) if len(missing) else 0)

    def gather(self, rows):
        rows = np.ascontiguousarray(rows, np.int64)
        out = None
        for s, e in self._stamped(rows):
            part = super().gather(rows[s:e])
            if s == 0 and e == len(rows):
                return part
            if out is None:
                out = np.empty((len(rows),) + part.shape[1:], part.dtype)
            out[s:e] = part
        return out if out is not None else super().gather(rows)

    def set_values(self, rows, values):
        rows = np.ascontiguousarray(rows, np.int64)
        for s, e in self._stamped(rows):
            super().set_values(rows[s:e], values[s:e])

    def set_state(self, rows, version, state):
        rows = np.ascontiguousarray(rows, np.int64)
        for s, e in self._stamped(rows):
            super().set_state(rows[s:e], version, {k: v[s:e] for k, v in state.items()})

    def update(self, rows, grads, scale, version=0):
        rows = np.ascontiguousarray(rows, np.int64)
        for s, e in self._stamped(rows):
            super().update(rows[s:e], grads[s:e], scale, version)

    def touch(self, rows, version):
        if self.last_seen is None:
            return
        rows = np.ascontiguousarray(rows, np.int64)
        for s, e in self._stamped(rows):
            super().touch(rows[s:e], version)

    # -- scans: they read cold rows without making them hot -----------------------------------------
    def _respill(self, first_row: int, end_row: int) -> None:
        """Drop again the pages of the spilled regions among rows first_row..end_row-1 (a scan
        read them: a checkpoint's pages must not push the training's rows out)."""
        if end_row <= first_row:
            return
        lo, hi = first_row >> self._shift, ((end_row - 1) >> self._shift) + 1
        regions = lo + np.flatnonzero(self._spilled[lo:hi])
        cuts = np.flatnonzero(np.diff(regions) != 1) + 1
        if not len(regions):
            return
        firsts, lasts = regions[np.r_[0, cuts]], regions[np.r_[cuts - 1, len(regions) - 1]]
        for first, last in zip(firsts.tolist(), lasts.tolist()):
            for array in self._tier_arrays():
                arena.drop(array, first << self._shift, (last + 1) << self._shift)

    def page(self, start, count):
        out: dict = {}
        end = min(self._rows, start + count)
        for s in range(start, max(start, end), self._chunk):
            e = min(end, s + self._chunk)
            part = super().page(s, e - s)
            for name, array in part.items():
                out.setdefault(name, []).append(array)
            self._respill(s, e)
        if not out:
            return super().page(start, count)
        return {name: np.concatenate(parts) for name, parts in out.items()}

    # A drop compacts every row (spilled ones paged in a piece at a time): SparseTable.drop_some
    # does a move's whole drop at once rather than slice by slice.
    drop_compacts = True

    def drop(self, ids):
        """The rows of ``ids`` out (a server move's old owner, once it handed them away): the
        others compacted down as an eviction does, spilled ones included, a piece at a time."""
        rows = self.lookup(ids)
        keep = np.ones(self._rows, bool)
        keep[rows[rows >= 0]] = False
        return self._compact(np.flatnonzero(keep).astype(np.int64)) if not keep.all() else 0

    def evict_unseen(self, before):
        rows = self._rows
        kept = kept_rows_kernel(self.last_seen, rows, before)
        if len(kept) == rows:
            self._respill(0, rows)
            return 0
        return self._compact(kept)

    def _compact(self, kept: np.ndarray) -> int:
        """Keep rows ``kept`` (ascending), in that order; how many went."""
        evicted = self._rows - len(kept)
        if not evicted:
            return 0
        compact_kernel(self.keys, kept)
        arena.release(self.keys, len(kept))
        # Compacted a piece at a time; behind each piece, every page of the rows it read and wrote
        # is dropped (the file keeps them), so the move never holds more than a piece in RAM.
        budget = self.memory_budget or (self.server_budget.budget if self.server_budget else 1 << 30)
        step = max(self.region_rows, int(budget // 4 // max(1, self.bytes_per_row)))
        dropped = 0
        arrays = self._tier_arrays()
        for s in range(0, len(kept), step):
            e = min(len(kept), s + step)
            for array in arrays:
                compact_range_kernel(array, kept, s, e)
            below = ((int(kept[e - 1]) + 1) >> self._shift) << self._shift
            if below > dropped:
                for array in arrays:
                    arena.drop(array, dropped, below)
                dropped = below
        for array in arrays:
            arena.release(array, len(kept))
        self._space.released(len(kept))
        self._rows = len(kept)
        self.index.rebuild(self.keys, self._rows)
        # Rows moved: the stamps meant other rows. What was dropped is spilled; the rest is new.
        spilled = min(self.regions_in_use, dropped >> self._shift)
        self._stamps[:] = 0
        self._heat[:] = 0
        self._promoted_at[:] = 0
        self._spilled[:] = 0
        self._spilled[:spilled] = 1
        self._spilled_count = spilled
        self.spills += spilled
        self._stamp_new(spilled << self._shift, self._rows)
        self._enforce()
        return evicted

    # -- life -----------------------------------------------------------------------------------------
    def clear(self) -> None:
        self._build(self.dim, self.rule, self._keep_last_seen, self._count_admissions, self.max_rows,
                    self._capacity, dict(value_dtype=self.value_dtype, rounding=self.rounding, seed=self.seed), True)

    def close(self) -> None:
        """Remove the files now (the mappings stay valid until the store is dropped)."""
        self.closed = True
        self._finalizer()


_tier_kernels_loaded = False


def _load_tier_kernels() -> None:
    """Load the tier kernels from numba's cache now (compiled by `make warm`), not on a first pull."""
    global _tier_kernels_loaded
    if _tier_kernels_loaded:
        return
    regions = np.zeros(4, np.uint32)
    stamp_kernel(np.zeros(2, np.int64), 0, 2, 11, regions, np.zeros(4, np.uint32), np.zeros(4, np.uint8),
                 np.zeros(4, np.uint32), 1, 1)
    stamp_range_kernel(0, 10, 11, regions, np.zeros(4, np.uint32), np.zeros(4, np.uint8), 1)
    compact_range_kernel(np.zeros((4, 2), np.float32), np.arange(2), 0, 2)
    compact_range_kernel(np.zeros(4, np.uint32), np.arange(2), 0, 2)
    _tier_kernels_loaded = True


if TYPE_CHECKING:   # `make typecheck` checks the contract: RowStore (server/storage/row_store.py)
    from paramshard.server.storage.row_store import RowStore
    _row_store: type[RowStore] = TieredRowStore
