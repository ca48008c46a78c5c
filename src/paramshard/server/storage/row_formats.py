"""Row storage formats of a sparse table: float32, float16, bfloat16; the reference in numpy.

A table's rows may be stored in half precision (``SparseEmbedding(dtype=...)``):
2 bytes a value instead of 4. Nothing else changes: optimizer state stays
float32, every update is the rule's float32 maths on the row loaded as float32,
and the new value is rounded to the format; every value that leaves a store
(pull, page, export) is the stored value as a float32, exactly, so the wire and
checkpoint files carry float32 as before.

Rounding (``rounding``):

- ``nearest`` (the default): round to nearest, ties to even. Also how every
  created row is rounded (initial rows, imports, checkpoint restores: a restored
  half row is exactly representable, so restoring is exact).
- ``stochastic`` (updates only): the new value goes to its neighbour away from
  zero with probability equal to its distance from the neighbour toward zero,
  in units of their gap, so updates smaller than a gap are kept on average
  instead of being lost. Formulas: kernels/half.py. The random bits are a pure
  function of (table seed, row id, table version, column), so both stores give
  the same rows, and a resumed run (same versions) equals an uninterrupted one::

      S       = mix64(seed ^ SALT_ROUND)                      (uint64 arithmetic, wrapping)
      noise   = mix64(mix64(id ^ S) + (version + 1) * GOLDEN)
      word[j] = mix64(noise + (j + 1) * GOLDEN) >> 32         (32 bits for column j)

  ``version`` is the table version the update completes (SparseTable.version
  before the update: a sync step, or an async push), so no row sees the same
  bits twice.

This module is the reference (numpy, the numpy store and the tables use it):
float16 through numpy's own float16 type, bfloat16 through its bits. The compiled
store has its own conversions (kernels/half.py); the tests hold them to these.
"""
from __future__ import annotations

import numpy as np

from paramshard.placement.sparse_hash import mix64
from paramshard.tables import ROUNDINGS, ROW_DTYPES, check_row_format

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
SALT_ROUND = np.uint64(0x3C3C3C3C3C3C3C3C)
MASK64 = (1 << 64) - 1

# The compiled kernels' format codes (kernels/half.py): the format, plus 4 when stochastic.
CODES = {"float32": 0, "float16": 1, "bfloat16": 2}
STOCHASTIC = 4

__all__ = ["ROW_DTYPES", "ROUNDINGS", "check_row_format", "code_of", "storage_dtype", "to_storage", "from_storage",
           "rounded", "round_salt", "version_key", "rounding_words"]


def code_of(dtype: str, rounding: str) -> int:
    return CODES[dtype] + (STOCHASTIC if rounding == "stochastic" else 0)


def storage_dtype(dtype: str) -> np.dtype:
    """What the numpy store keeps: float32, numpy's float16, or bfloat16 bits as uint16."""
    return np.dtype({"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}[dtype])


def _bf16_nearest(values: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32).astype(np.uint64)
    out = ((bits + 0x7FFF + ((bits >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        out[nan] = ((bits[nan] >> np.uint64(16)) | np.uint64(0x40)).astype(np.uint16)
    return out


def _bf16_stochastic(values: np.ndarray, words: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32)
    up = (words >> np.uint32(16)) < (bits & np.uint32(0xFFFF))
    out = ((bits >> np.uint32(16)) + up).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        out[nan] = ((bits[nan] >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint16)
    return out


def _f16_stochastic(values: np.ndarray, words: np.ndarray) -> np.ndarray:
    """lo: the float16 next to x toward zero, hi: away from zero; hi iff (w >> 8) < p * 2**24."""
    x = np.asarray(values, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        near = x.astype(np.float16)
        lo = np.abs(near)
        past = lo.astype(np.float64) > np.abs(x).astype(np.float64)     # nearest rounded away from zero
        lo[past] = np.nextafter(lo[past], np.float16(0))
        gap = np.spacing(lo).astype(np.float64)
        gap[lo == np.float16(65504)] = 32.0                             # the gap to "65536", which is inf
        p24 = (np.abs(x).astype(np.float64) - lo.astype(np.float64)) / gap * float(1 << 24)   # exact
        up = (words >> np.uint32(8)).astype(np.float64) < p24
        magnitude = np.where(up, np.nextafter(lo, np.float16(np.inf)), lo)
        out = np.where(np.signbit(x), -magnitude, magnitude)
    finite = np.isfinite(x)
    return np.where(finite, out, near)


def to_storage(values: np.ndarray, dtype: str, words: np.ndarray | None = None) -> np.ndarray:
    """float32 values in the storage dtype (storage_dtype): rounded to nearest, or
    stochastically with ``words`` (uint32, one per value, rounding_words)."""
    values = np.asarray(values, np.float32)
    if dtype == "float32":
        return values
    if dtype == "float16":
        if words is None:
            with np.errstate(over="ignore"):
                return values.astype(np.float16)
        return _f16_stochastic(values, words)
    return _bf16_nearest(values) if words is None else _bf16_stochastic(values, words)


def from_storage(stored: np.ndarray, dtype: str) -> np.ndarray:
    """Stored values as float32 (exact)."""
    if dtype == "bfloat16":
        return (np.asarray(stored, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
    return np.asarray(stored).astype(np.float32)


def rounded(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values as a table of ``dtype`` would hold them (nearest), as float32."""
    if dtype == "float32":
        return np.asarray(values, np.float32)
    return from_storage(to_storage(values, dtype), dtype)


def round_salt(seed: int) -> np.uint64:
    """S: the table's part of every random word."""
    return np.uint64(mix64(np.uint64(seed) ^ SALT_ROUND))


def version_key(version: int) -> np.uint64:
    """(version + 1) * GOLDEN, wrapping: the update's part of every random word."""
    return np.uint64(((int(version) + 1) * int(GOLDEN)) & MASK64)


def rounding_words(seed: int, ids: np.ndarray, version: int, dim: int) -> np.ndarray:
    """The random words of an update at ``version`` of the rows of ``ids``: uint32 [n, dim]."""
    ids = np.asarray(ids, np.uint64)
    with np.errstate(over="ignore"):
        noise = mix64(mix64(ids ^ round_salt(seed)) + version_key(version))
        cols = np.arange(1, dim + 1, dtype=np.uint64) * GOLDEN
        return (mix64(noise[:, None] + cols[None, :]) >> np.uint64(32)).astype(np.uint32)
