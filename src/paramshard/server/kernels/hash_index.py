"""uint64 id -> row number: open addressing that grows without a stall.

The ids themselves live in the store's ``keys`` array, in row order (export,
checkpoints and eviction need them anyway); a bucket holds only an int32 row
number, so the index costs 7-13 bytes a row (load kept between 0.3 and 0.6,
where linear probing rarely reads a second key). A bucket holds row + 1, so 0 means empty and a
new bucket array is np.zeros: pages the kernel hands out zeroed on first
touch, where filling gigabytes with -1 would itself stall for seconds.

Growth is incremental (as Redis rehashes a dict): when the next insert would
pass MAX_LOAD, a bucket array twice as large is allocated and becomes the one
inserts go to, and the old one is drained into it a slice per call, eight old
buckets for every id inserted and at least ``MIN_DRAIN`` per call, so the old
array is empty long before the new one fills (after len(old) / 8 inserts,
while the new one has room for at least 0.15 * len(new) = 0.3 * len(old) more). A lookup meanwhile
looks in the new array, then in the old. A drained bucket is marked MOVED, not
emptied, so probe chains that pass through it stay intact. No call ever
rehashes the whole table: at 100M rows a full rehash takes seconds, a slice
milliseconds.
"""
from __future__ import annotations

import numba
import numpy as np

from .hashing import mix64

EMPTY, MOVED = 0, -1      # otherwise a bucket holds its row + 1
MAX_LOAD = 0.6           # a bucket array holds at most this share of ids
GROW_TO_LOAD = 0.3       # ...and a new one starts at most this full
GROWN_LOAD = 0.45        # growth doubles the buckets (more if a batch needs it) to at most this
DRAIN_PER_INSERT = 8     # old buckets drained for every id inserted: done within len(old) / 8
                         # inserts, while the new array has room for (0.6 - 0.45) * 2 * len(old)
MIN_DRAIN = 1 << 16      # old buckets drained by every call, lookups included
U1 = np.uint64(1)


@numba.njit(cache=True, error_model="numpy", inline="always")
def _find(buckets, keys, key, h):
    mask = np.uint64(len(buckets) - 1)
    p = h & mask
    while True:
        r = buckets[p]
        if r == EMPTY:
            return -1
        if r > 0 and keys[r - 1] == key:
            return r - 1
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
    """Put ``entry`` (row + 1; its id hashes to ``h`` and is in no bucket) in the first free bucket."""
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
        entry = buckets[mix64(ids[i]) & mask]
        if entry > 0:
            total += keys[entry - 1]
    return total


@numba.njit(cache=True, error_model="numpy")
def lookup_kernel(buckets, old, keys, ids, out):
    touched = np.uint64(0)
    for start in range(0, len(ids), GROUP):
        end = min(len(ids), start + GROUP)
        touched += prefetch_buckets(buckets, keys, ids, start, end)
        for i in range(start, end):
            out[i] = find(buckets, old, keys, ids[i])
    return touched


@numba.njit(cache=True, error_model="numpy")
def place_kernel(buckets, keys, first, count):
    """Index rows first..first+count-1 (their ids already in ``keys``)."""
    for r in range(first, first + count):
        place(buckets, np.int32(r + 1), mix64(keys[r]))


@numba.njit(cache=True, error_model="numpy")
def drain_kernel(buckets, old, keys, start, budget):
    """Move old buckets start..start+budget-1 into ``buckets``; where draining stopped."""
    end = min(len(old), start + budget)
    for i in range(start, end):
        entry = old[i]
        if entry > 0:
            place(buckets, entry, mix64(keys[entry - 1]))
            old[i] = MOVED
    return end


def buckets_for(rows: int) -> int:
    """A power of two holding ``rows`` ids at most GROW_TO_LOAD full."""
    return 1 << max(4, int(np.ceil(np.log2(max(rows, 1) / GROW_TO_LOAD))))


class HashIndex:
    """The index of one store. It never owns the ids: every call takes ``keys``."""

    def __init__(self, capacity: int = 0):
        self.buckets = np.zeros(buckets_for(capacity), np.int32)
        self.old = np.empty(0, np.int32)       # the array being drained, empty when none is
        self.drained = 0

    @property
    def nbytes(self) -> int:
        return self.buckets.nbytes + self.old.nbytes

    @property
    def draining(self) -> bool:
        return len(self.old) > 0

    def drain(self, keys: np.ndarray, budget: int) -> None:
        if not len(self.old):
            return
        self.drained = drain_kernel(self.buckets, self.old, keys, self.drained, max(budget, MIN_DRAIN))
        if self.drained >= len(self.old):
            self.old, self.drained = np.empty(0, np.int32), 0

    def lookup(self, keys: np.ndarray, ids: np.ndarray) -> np.ndarray:
        self.drain(keys, MIN_DRAIN)
        out = np.empty(len(ids), np.int64)
        lookup_kernel(self.buckets, self.old, keys, ids, out)
        return out

    def make_room(self, keys: np.ndarray, rows: int, adding: int) -> None:
        """Before ``adding`` ids join the ``rows`` indexed: drain a slice, and start a larger
        bucket array if they would pass MAX_LOAD. Allocates before anything changes, so a
        MemoryError leaves the index as it was."""
        self.drain(keys, DRAIN_PER_INSERT * adding)
        total = rows + adding
        if total <= MAX_LOAD * len(self.buckets):
            return
        size = 2 * len(self.buckets)
        while total > GROWN_LOAD * size:   # doubling is not enough for a batch this large
            size *= 2
        bigger = np.zeros(size, np.int32)
        if self.draining or adding >= rows:
            # Still draining the last growth (only a batch larger than the whole table gets
            # here that fast), or a batch as large as the table: rebuilding costs no more
            # than the batch itself.
            place_kernel(bigger, keys, 0, rows)
            self.buckets, self.old, self.drained = bigger, np.empty(0, np.int32), 0
            return
        self.buckets, self.old, self.drained = bigger, self.buckets, 0

    def insert(self, keys: np.ndarray, first: int, count: int) -> None:
        """Index rows first..first+count-1, whose distinct, absent ids are already in ``keys``;
        make_room(keys, first, count) must come first."""
        place_kernel(self.buckets, keys, first, count)

    def reserve(self, keys: np.ndarray, rows: int, indexed: int) -> None:
        """Buckets for ``rows`` ids now (a capacity hint): built aside, swapped in."""
        if rows <= MAX_LOAD * len(self.buckets) and not self.draining:
            return
        bigger = np.zeros(max(buckets_for(rows), len(self.buckets)), np.int32)
        place_kernel(bigger, keys, 0, indexed)
        self.buckets, self.old, self.drained = bigger, np.empty(0, np.int32), 0

    def rebuild(self, keys: np.ndarray, rows: int) -> None:
        """Index exactly keys[0..rows-1] (after rows were compacted)."""
        fresh = np.zeros(buckets_for(rows), np.int32)
        place_kernel(fresh, keys, 0, rows)
        self.buckets, self.old, self.drained = fresh, np.empty(0, np.int32), 0
