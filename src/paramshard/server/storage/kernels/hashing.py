"""splitmix64's finaliser in compiled form: placement.sparse_hash.mix64, one id at a time.

Every constant is a np.uint64: numba would turn a uint64 mixed with an int
literal into a float64 and lose the hash.
"""
from __future__ import annotations

import numba
import numpy as np

C1 = np.uint64(0xBF58476D1CE4E5B9)
C2 = np.uint64(0x94D049BB133111EB)
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
S8, S24, S27, S30, S31, S40 = (np.uint64(s) for s in (8, 24, 27, 30, 31, 40))
LOW24 = np.uint64(0xFFFFFF)


@numba.njit(cache=True, error_model="numpy", inline="always")
def mix64(z):
    z = (z ^ (z >> S30)) * C1
    z = (z ^ (z >> S27)) * C2
    return z ^ (z >> S31)
