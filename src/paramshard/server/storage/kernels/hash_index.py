"""uint64 id -> row number: open addressing that grows without a stall.

The ids themselves live in the store's ``keys`` array, in row order (export,
checkpoints and eviction need them anyway). A bucket is one uint64: the high
32 bits of the id's hash (a fingerprint) over row + 1. A probe that meets
another id's bucket rejects it on the fingerprint without reading that id
from ``keys`` (a cache miss each: with bare row numbers, inserting a new id
into a table 60% full read 2.6 other ids on average, and a first touch ran at
1.4M rows/s). With fingerprints a probe stays inside one or two cache lines,
so the buckets can be 3/4 full: 10.7-21.3 bytes a row. 0 means empty, so a
new bucket array is np.zeros: pages the kernel hands out zeroed on first
touch, where filling gigabytes with a marker would itself stall for seconds.

Growth is incremental (as Redis rehashes a dict): when the next insert would
pass MAX_LOAD, a bucket array twice as large is allocated and becomes the one
inserts go to, and the old one is drained into it a slice per call, four old
buckets for every id inserted and at least ``MIN_DRAIN`` per call, so the old
array is empty long before the new one fills (after len(old) / 4 inserts,
while the new one has room for at least (0.75 - 0.5) * len(new) = len(old) / 2 more). A lookup meanwhile
looks in the new array, then in the old. A drained bucket is marked MOVED, not
emptied, so probe chains that pass through it stay intact. No call ever
rehashes the whole table: at 100M rows a full rehash takes seconds, a slice
milliseconds.
"""
from __future__ import annotations

import numba
import numpy as np

from paramshard.server.storage.kernels import arena
from paramshard.server.storage.kernels.hashing import mix64

EMPTY = np.uint64(0)
MOVED = np.uint64(0xFFFFFFFFFFFFFFFF)     # row + 1 < 2^32 - 1: never a bucket's low half
LOW32 = np.uint64(0xFFFFFFFF)
S32 = np.uint64(32)
MAX_LOAD = 0.75          # a bucket array holds at most this share of ids
GROW_TO_LOAD = 0.375     # ...and a new one starts at most this full
GROWN_LOAD = 0.5         # growth doubles the buckets (more if a batch needs it) to at most this
DRAIN_PER_INSERT = 4     # old buckets drained for every id inserted: done within len(old) / 4
                         # inserts, while the new array has room for (0.75 - 0.5) * 2 * len(old) = len(old) / 2
MIN_DRAIN = 1 << 16      # old buckets drained by every call, lookups included
SPARE_LOAD = 0.5         # past this load the next growth's buckets are paged in ahead (prepare)
SPARE_BYTES_PER_INSERT = 128     # 2 * 8 bytes a bucket / (0.75 - 0.5) of them to go = 64: twice that
SPARE_MIN_BYTES = 1 << 20
U1 = np.uint64(1)


@numba.njit(cache=True, error_model="numpy", inline="always")
def entry_of(row, h):
    """A bucket: the hash's high half over row + 1."""
    return (h & ~LOW32) | np.uint64(row + 1)


@numba.njit(cache=True, error_model="numpy", inline="always")
def _find(buckets, keys, key, h):
    mask = np.uint64(len(buckets) - 1)
    fingerprint = h >> S32
    p = h & mask
    while True:
        e = buckets[p]
        if e == EMPTY:
            return -1
        if e != MOVED and (e >> S32) == fingerprint:
            r = np.int64(e & LOW32) - 1
            if keys[r] == key:
                return r
        p = (p + U1) & mask


@numba.njit(cache=True, error_model="numpy", inline="always")
def find(buckets, old, keys, key):
    """Row of ``key``, -1 if it has none."""
    h = mix64(key)
    r = _find(buckets, keys, key, h)
    if r < 0 and len(old):
        r = _find(old, keys, key, h)
    return r


@numba.njit(cache=True, error_model="numpy", inline="always")
def place(buckets, entry, h):
    """Put ``entry`` (entry_of(row, h); the id hashes to ``h`` and is in no bucket) in the first
    free bucket."""
    mask = np.uint64(len(buckets) - 1)
    p = h & mask
    while buckets[p] != EMPTY:
        p = (p + U1) & mask
    buckets[p] = entry


GROUP = 16


@numba.njit(cache=True, error_model="numpy", inline="always")
def prefetch_buckets(buckets, keys, ids, start, end):
    """Read the home bucket of ids[start:end] and the key it points to: independent loads
    the CPU overlaps, so the probes that follow find them in cache instead of waiting for
    one miss after another."""
    mask = np.uint64(len(buckets) - 1)
    total = np.uint64(0)
    for i in range(start, end):
        h = mix64(ids[i])
        entry = buckets[h & mask]
        if entry != EMPTY and entry != MOVED and (entry >> S32) == (h >> S32):
            total += keys[np.int64(entry & LOW32) - 1]
    return total


@numba.njit(cache=True, error_model="numpy", nogil=True)
def lookup_kernel(buckets, old, keys, ids, out):
    touched = np.uint64(0)
    for start in range(0, len(ids), GROUP):
        end = min(len(ids), start + GROUP)
        touched += prefetch_buckets(buckets, keys, ids, start, end)
        for i in range(start, end):
            out[i] = find(buckets, old, keys, ids[i])
    return touched


@numba.njit(cache=True, error_model="numpy", nogil=True)
def place_kernel(buckets, keys, first, count):
    """Index rows first..first+count-1 (their ids already in ``keys``)."""
    for r in range(first, first + count):
        h = mix64(keys[r])
        place(buckets, entry_of(r, h), h)


@numba.njit(cache=True, error_model="numpy", nogil=True)
def drain_kernel(buckets, old, keys, start, budget):
    """Move old buckets start..start+budget-1 into ``buckets``; where draining stopped."""
    end = min(len(old), start + budget)
    for i in range(start, end):
        entry = old[i]
        if entry != EMPTY and entry != MOVED:
            place(buckets, entry, mix64(keys[np.int64(entry & LOW32) - 1]))
            old[i] = MOVED
    return end


@numba.njit(cache=True, error_model="numpy", inline="always")
def _slot_of(buckets, keys, key, h, row):
    """The bucket holding ``row`` (whose id is ``key``, hashing to ``h``), -1 if none."""
    mask = np.uint64(len(buckets) - 1)
    p = h & mask
    while True:
        e = buckets[p]
        if e == EMPTY:
            return -1
        if e != MOVED and np.int64(e & LOW32) - 1 == row:
            return np.int64(p)
        p = (p + U1) & mask


@numba.njit(cache=True, error_model="numpy", nogil=True)
def delete_kernel(buckets, old, keys, rows):
    """Unindex rows ``rows`` (their ids still in ``keys``): each bucket becomes MOVED, which probes
    pass over, so the chains through it stay intact. How many of them were in ``buckets`` (there
    they count against the load until the next growth drops them; in ``old`` they are as drained)."""
    in_new = 0
    for i in range(len(rows)):
        r = rows[i]
        h = mix64(keys[r])
        p = _slot_of(buckets, keys, keys[r], h, r)
        if p >= 0:
            buckets[p] = MOVED
            in_new += 1
        elif len(old):
            p = _slot_of(old, keys, keys[r], h, r)
            if p >= 0:
                old[p] = MOVED
    return in_new


@numba.njit(cache=True, error_model="numpy", nogil=True)
def repoint_kernel(buckets, old, keys, movers, holes):
    """Row movers[i] moved to holes[i] (its id is now in keys[holes[i]]): its bucket says so."""
    for i in range(len(movers)):
        key = keys[holes[i]]
        h = mix64(key)
        p = _slot_of(buckets, keys, key, h, movers[i])
        if p >= 0:
            buckets[p] = entry_of(holes[i], h)
        elif len(old):
            p = _slot_of(old, keys, key, h, movers[i])
            if p >= 0:
                old[p] = entry_of(holes[i], h)


def buckets_for(rows: int, load: float = GROW_TO_LOAD) -> int:
    """A power of two holding ``rows`` ids at most ``load`` full."""
    return 1 << max(4, int(np.ceil(np.log2(max(rows, 1) / load))))


class HashIndex:
    """The index of one store. It never owns the ids: every call takes ``keys``."""

    label = "a row store"      # what address-space errors call the store (CompiledRowStore.label)

    def __init__(self, capacity: int = 0):
        self.buckets = self._zeros(buckets_for(capacity, MAX_LOAD))
        self.old = np.empty(0, np.uint64)       # the array being drained, empty when none is
        self.drained = 0
        self.spare: np.ndarray | None = None     # the next growth's buckets, paged in ahead
        self.spare_ready = 0                      # ... up to this bucket
        # Buckets of ``buckets`` emptied by ``delete`` (MOVED): they fill it as ids do until the
        # next array replaces it (a growth drains only live entries).
        self.tombstones = 0

    def _zeros(self, count: int) -> np.ndarray:
        return arena.zeros(count, np.uint64, what=f"{self.label}: its id index")

    @property
    def nbytes(self) -> int:
        return self.buckets.nbytes + self.old.nbytes + self.spare_ready * 8

    @property
    def draining(self) -> bool:
        return len(self.old) > 0

    def drain(self, keys: np.ndarray, budget: int) -> None:
        if not len(self.old):
            return
        self.drained = drain_kernel(self.buckets, self.old, keys, self.drained, max(budget, MIN_DRAIN))
        if self.drained >= len(self.old):
            self.old, self.drained = np.empty(0, np.uint64), 0

    def lookup(self, keys: np.ndarray, ids: np.ndarray) -> np.ndarray:
        self.drain(keys, MIN_DRAIN)
        out = np.empty(len(ids), np.int64)
        lookup_kernel(self.buckets, self.old, keys, ids, out)
        return out

    def room(self, rows: int) -> int:
        """Ids that can join the ``rows`` indexed before the buckets must grow."""
        return max(0, int(MAX_LOAD * len(self.buckets)) - rows - self.tombstones)

    def delete(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Unindex rows ``rows`` (distinct, their ids still in ``keys``): a cost per row, not per table."""
        self.tombstones += int(delete_kernel(self.buckets, self.old, keys, np.ascontiguousarray(rows, np.int64)))

    def repoint(self, keys: np.ndarray, movers: np.ndarray, holes: np.ndarray) -> None:
        """Rows ``movers`` now live at ``holes`` (keys[holes] holds their ids)."""
        repoint_kernel(self.buckets, self.old, keys, np.ascontiguousarray(movers, np.int64),
                       np.ascontiguousarray(holes, np.int64))

    def prepare(self, rows: int, added: int) -> None:
        """After ``added`` ids joined (``rows`` now indexed): once the buckets are past
        SPARE_LOAD, page in the next growth's array a slice at a time (SPARE_BYTES_PER_INSERT
        for each id added, at least SPARE_MIN_BYTES a call), so it is all in memory by the
        time it is needed. Its page faults (and the kernel's compaction for huge pages: 0.1-0.2
        s for 128 MB, measured) would otherwise all land on the one request that grows."""
        if rows < SPARE_LOAD * len(self.buckets) or self.draining:
            return
        if self.spare is None or len(self.spare) != 2 * len(self.buckets):
            try:
                self.spare, self.spare_ready = self._zeros(2 * len(self.buckets)), 0
            except MemoryError:
                # Past the address-space limit (kernels/arena.py): no paging ahead. This runs after
                # the rows were made, so it must not fail the request; the growth itself
                # (make_room) is refused cleanly, before any row, if it still does not fit.
                self.spare, self.spare_ready = None, 0
                return
        end = min(len(self.spare), self.spare_ready + max(SPARE_MIN_BYTES, SPARE_BYTES_PER_INSERT * added) // 8)
        self.spare[self.spare_ready:end] = 0      # writing is what pages it in
        self.spare_ready = end

    def _new_buckets(self, size: int) -> np.ndarray:
        if self.spare is not None and len(self.spare) == size:
            bigger, self.spare, self.spare_ready = self.spare, None, 0
            return bigger
        self.spare, self.spare_ready = None, 0
        return self._zeros(size)

    def make_room(self, keys: np.ndarray, rows: int, adding: int) -> None:
        """Before ``adding`` ids join the ``rows`` indexed: drain a slice, and start a larger
        bucket array if they would pass MAX_LOAD. Allocates before anything changes, so a
        MemoryError leaves the index as it was."""
        self.drain(keys, DRAIN_PER_INSERT * adding)
        total = rows + adding
        if total + self.tombstones <= MAX_LOAD * len(self.buckets):
            return
        # Full of ids, or of MOVED buckets left by drops: then an array of the same size, drained
        # into as a growth is, has room enough.
        size = len(self.buckets) if total <= GROWN_LOAD * len(self.buckets) else 2 * len(self.buckets)
        while total > GROWN_LOAD * size:   # doubling is not enough for a batch this large
            size *= 2
        bigger = self._new_buckets(size)
        if self.draining or adding >= rows:
            # Still draining the last growth (only a batch larger than the whole table gets
            # here that fast), or a batch as large as the table: rebuilding costs no more
            # than the batch itself.
            place_kernel(bigger, keys, 0, rows)
            self.buckets, self.old, self.drained, self.tombstones = bigger, np.empty(0, np.uint64), 0, 0
            return
        self.buckets, self.old, self.drained, self.tombstones = bigger, self.buckets, 0, 0

    def insert(self, keys: np.ndarray, first: int, count: int) -> None:
        """Index rows first..first+count-1, whose distinct, absent ids are already in ``keys``;
        make_room(keys, first, count) must come first."""
        place_kernel(self.buckets, keys, first, count)

    def reserve(self, keys: np.ndarray, rows: int, indexed: int) -> None:
        """Buckets for ``rows`` ids now (a capacity hint): built aside, swapped in."""
        if rows + self.tombstones <= MAX_LOAD * len(self.buckets) and not self.draining:
            return
        # Room for ``rows`` ids before the next growth: a capacity hint is the expected table
        # size, so sizing it at GROW_TO_LOAD would keep up to 4x the buckets it needs.
        bigger = self._zeros(max(buckets_for(rows, MAX_LOAD), len(self.buckets)))
        place_kernel(bigger, keys, 0, indexed)
        self.buckets, self.old, self.drained, self.tombstones = bigger, np.empty(0, np.uint64), 0, 0

    def rebuild(self, keys: np.ndarray, rows: int) -> None:
        """Index exactly keys[0..rows-1] (after rows were compacted)."""
        fresh = self._zeros(buckets_for(rows))
        place_kernel(fresh, keys, 0, rows)
        self.buckets, self.old, self.drained, self.tombstones = fresh, np.empty(0, np.uint64), 0, 0
