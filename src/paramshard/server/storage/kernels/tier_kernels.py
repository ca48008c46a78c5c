"""Residency bookkeeping of the disk tier (server/storage/tiered_row_store.py), compiled.

Rows are grouped in regions of 2**shift consecutive rows; each region has a
last-touched stamp (a uint32 clock, one tick per piece of a store call), a heat
(pieces that touched it, halved now and then: how often, where the stamp says
how lately), a spilled flag (its pages were dropped from the process: they come
back by page fault), and the clock of its last promotion. A store call stamps the regions of the rows it
touched here, in one pass: no per-row Python, nothing of the batch's size
allocated.
"""
from __future__ import annotations

import numba
import numpy as np


HEAT_MAX = np.uint32(0xFFFFFFFF)


@numba.njit(cache=True, error_model="numpy", nogil=True)
def stamp_kernel(rows, start, end, shift, stamps, heat, spilled, promoted_at, clock, limit):
    """Stamp the region of each of rows[start:end] (-1: none) with ``clock`` and warm it (heat + 1,
    once per clock). A spilled region touched comes back (a promotion: its flag is cleared).
    Stops before the row that would make more than ``limit`` promotions (never before the
    first row): what the budget has room for. Returns (where it stopped, hits, misses,
    promotions): a row access is a hit when its region was resident as the piece began."""
    hits = 0
    misses = 0
    promotions = 0
    i = start
    while i < end:
        r = rows[i]
        if r >= 0:
            g = r >> shift
            if stamps[g] != clock:
                if spilled[g]:
                    if promotions >= limit and i > start:
                        break
                    spilled[g] = 0
                    promoted_at[g] = clock
                    promotions += 1
                stamps[g] = clock
                if heat[g] < HEAT_MAX:
                    heat[g] += 1
            if promoted_at[g] == clock:
                misses += 1
            else:
                hits += 1
        i += 1
    return i, hits, misses, promotions


@numba.njit(cache=True, error_model="numpy", nogil=True)
def stamp_range_kernel(first, end, shift, stamps, heat, spilled, clock):
    """Stamp the regions of rows first..end-1 (new rows: written, so resident; warm enough not to
    be the first to go before they are read); how many of them were flagged spilled (a
    region whose old rows were spilled gets new ones)."""
    back = 0
    if end <= first:
        return back
    for g in range(first >> shift, ((end - 1) >> shift) + 1):
        stamps[g] = clock
        if heat[g] == 0:
            heat[g] = 1
        if spilled[g]:
            spilled[g] = 0
            back += 1
    return back


@numba.njit(cache=True, error_model="numpy", nogil=True)
def compact_range_kernel(array, kept, start, end):
    """array[i] = array[kept[i]] for i in start..end-1 (``kept`` increasing: rows move down)."""
    for i in range(start, end):
        k = kept[i]
        if k != i:
            array[i] = array[k]
