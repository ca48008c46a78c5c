"""Compiled row operations of the compiled store: first touch, gather, compaction.

Rows are visited in groups of GROUP: first a pass that only reads each row's
first element (independent loads the CPU overlaps, tens of cache misses in
flight), then the pass that does the work on rows now in cache. A plain loop
that works row by row waits for one miss after another: measured 2x slower
than numpy's vectorised take for a gather, and as fast as it with the groups.
"""
from __future__ import annotations

import numba
import numpy as np

from paramshard.server.storage.kernels.half import copy_row_out, write_initial_values
from paramshard.server.storage.kernels.hash_index import entry_of, find, place, prefetch_buckets
from paramshard.server.storage.kernels.hashing import mix64


GROUP = 16


@numba.njit(cache=True, error_model="numpy", inline="always")
def prefetch(array, rows, start, end):
    """Read the first element of rows[start:end] of ``array`` (its sum keeps the reads alive)."""
    total = 0.0
    for i in range(start, end):
        total += array[rows[i], 0]
    return total


@numba.njit(cache=True, error_model="numpy", nogil=True)
def first_touch_kernel(buckets, old, keys, values, ids, start, first, room, salt, two_scale, scale, out,
                       scratch, fmt):
    """out[i] = the row of ids[i], for i from ``start`` on; an id without one gets the next row
    (first, first + 1, ..., in the order ids first appear) with its initial values, indexed at
    once, so a repeat later in the batch finds it. Stops before making row number ``room``
    + 1 (the index or the arrays would be full). Returns (rows made, where it stopped).
    Half rows (kernels/half.py, ``fmt``) are written through ``scratch``, a float32 row."""
    made = 0
    for i in range(start, len(ids)):
        if (i - start) % GROUP == 0:
            prefetch_buckets(buckets, keys, ids, i, min(len(ids), i + GROUP))
        key = ids[i]
        r = find(buckets, old, keys, key)
        if r < 0:
            if made == room:
                return made, i
            r = first + made
            made += 1
            keys[r] = key
            write_initial_values(values, r, scratch, key, salt, two_scale, scale, fmt)
            h = mix64(key)
            place(buckets, entry_of(r, h), h)
        out[i] = r
    return made, len(ids)


@numba.njit(cache=True, error_model="numpy", nogil=True)
def gather_kernel(values, rows, out, fmt):
    touched = 0.0
    for start in range(0, len(rows), GROUP):
        end = min(len(rows), start + GROUP)
        touched += prefetch(values, rows, start, end)
        for i in range(start, end):
            copy_row_out(values, rows[i], out[i], fmt)
    return touched


@numba.njit(cache=True, error_model="numpy", nogil=True)
def compact_kernel(array, kept):
    """array[i] = array[kept[i]] for increasing ``kept`` (each row moves down or stays)."""
    for i in range(len(kept)):
        k = kept[i]
        if k != i:
            array[i] = array[k]


@numba.njit(cache=True, error_model="numpy", nogil=True)
def kept_rows_kernel(last_seen, rows, before):
    """Rows 0..rows-1 last seen at ``before`` or later, in order."""
    out = np.empty(rows, np.int64)
    n = 0
    for r in range(rows):
        if np.int64(last_seen[r]) >= before:
            out[n] = r
            n += 1
    return out[:n]
