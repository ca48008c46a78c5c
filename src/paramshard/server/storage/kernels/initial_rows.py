"""A new row's values in place: placement.sparse_hash.initial_rows, one row at a time.

Same hashes, same float32 operations in the same order, so a row made here
equals the numpy function's bit for bit (tests/unit/server/storage/kernels/test_kernels.py checks it).
"""
from __future__ import annotations

import numba
import numpy as np

from paramshard.placement.sparse_hash import mix64 as mix64_array
from paramshard.server.storage.kernels.hashing import GOLDEN, LOW24, S8, S40, mix64

UNIT = np.float32(1.0 / (1 << 24))


def seed_salt(seed: int) -> np.uint64:
    """The per-table part of every row's hash (computed once a call, not once a row)."""
    with np.errstate(over="ignore"):
        return np.uint64(mix64_array(np.uint64(seed) * GOLDEN + GOLDEN))


@numba.njit(cache=True, error_model="numpy", inline="always")
def write_initial_row(out, key, salt, two_scale, scale):
    """out[:] = the initial row of ``key``; two_scale, scale: float32(2 * scale), float32(scale)."""
    dim = len(out)
    base = mix64(key ^ salt)
    for pair in range((dim + 1) // 2):
        h = mix64(base + np.uint64(pair + 1) * GOLDEN)
        col = 2 * pair
        out[col] = np.float32(h >> S40) * UNIT * two_scale - scale
        if col + 1 < dim:
            out[col + 1] = np.float32((h >> S8) & LOW24) * UNIT * two_scale - scale


@numba.njit(cache=True, error_model="numpy", nogil=True)
def initial_rows_kernel(ids, salt, two_scale, scale, out):
    for i in range(len(ids)):
        write_initial_row(out[i], ids[i], salt, two_scale, scale)


def initial_rows(seed: int, ids: np.ndarray, dim: int, scale: float) -> np.ndarray:
    """The compiled twin of placement.sparse_hash.initial_rows."""
    out = np.empty((len(ids), dim), np.float32)
    initial_rows_kernel(np.asarray(ids, np.uint64), seed_salt(seed), np.float32(2 * scale), np.float32(scale), out)
    return out
