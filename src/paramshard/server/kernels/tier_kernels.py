"""Residency bookkeeping of the disk tier (server/tiered_row_store.py), compiled.

Rows are grouped in regions of 2**shift consecutive rows; each region has a
last-touched stamp (a uint32 clock, one tick per store call), a spilled flag
(its pages were dropped from the process: they come back by page fault), and
the clock of its last promotion. A store call stamps the regions of the rows it
touched here, in one pass: no per-row Python, nothing of the batch's size
allocated.
"""
from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, error_model="numpy")
def stamp_kernel(rows, shift, stamps, spilled, promoted_at, clock):
    """Stamp the region of each row (-1: none) with ``clock``. A spilled region touched comes
    back (a promotion: its flag is cleared). Returns (hits, misses, promotions): a row access
    is a hit when its region was resident as the call began, a miss when it was spilled."""
    hits = 0
    misses = 0
    promotions = 0
    for i in range(len(rows)):
        r = rows[i]
        if r < 0:
            continue
        g = r >> shift
        if stamps[g] != clock:
            stamps[g] = clock
            if spilled[g]:
                spilled[g] = 0
                promoted_at[g] = clock
                promotions += 1
        if promoted_at[g] == clock:
            misses += 1
        else:
            hits += 1
    return hits, misses, promotions


@numba.njit(cache=True, error_model="numpy")
def stamp_range_kernel(first, end, shift, stamps, spilled, clock):
    """Stamp the regions of rows first..end-1 (new rows: written, so resident); how many of
    them were flagged spilled (a region whose old rows were spilled gets new ones)."""
    back = 0
    if end <= first:
        return back
    for g in range(first >> shift, ((end - 1) >> shift) + 1):
        stamps[g] = clock
        if spilled[g]:
            spilled[g] = 0
            back += 1
    return back


@numba.njit(cache=True, error_model="numpy")
def compact_range_kernel(array, kept, start, end):
    """array[i] = array[kept[i]] for i in start..end-1 (``kept`` increasing: rows move down)."""
    for i in range(start, end):
        k = kept[i]
        if k != i:
            array[i] = array[k]
