"""Half-precision row values in compiled code: float16 and bfloat16 held as their uint16 bits.

numba has no float16 type, so a half table's row array is uint16 and every value
is converted here, in registers: a float32 is reinterpreted as its 32 bits (an
LLVM bitcast, ``f32_bits``), rounded to 16 bits with integer operations, and
back. The maths of an update stays float32; only loading a row value and storing
the new one convert. The conversions, exactly:

- float16, round to nearest even: IEEE binary16, subnormals kept, a value of
  magnitude >= 65520 becomes inf, NaN stays NaN with its top 10 payload bits
  (a payload that would vanish becomes 1), as numpy's ``astype(np.float16)``
  does (tests/unit/test_half.py checks every class of float32 against it).
- bfloat16, round to nearest even: ``(bits + 0x7FFF + ((bits >> 16) & 1)) >> 16``
  (overflow to inf falls out of the carry); NaN -> ``(bits >> 16) | 0x0040``
  (sign and top payload kept, quiet bit set).
- stochastic rounding, from a 32-bit random word ``w``: a value between two
  neighbours lo (toward zero) and hi (away from zero) of the format goes to hi
  with probability p = (|x| - |lo|) / (|hi| - |lo|). bfloat16: hi iff
  ``(w >> 16) < (bits & 0xFFFF)`` (the same as adding the 16 random bits
  ``0xFFFF - (w >> 16)`` and truncating): p exactly. float16: hi iff
  ``(w >> 8) < p * 2**24`` (24 random bits): p exactly wherever |x| >= 2**-25,
  p rounded up to a multiple of 2**-24 below (values nearest rounding sends to 0).
  Above the largest finite value hi is inf. inf and NaN convert as with nearest.

Where the random words come from (row_formats.py documents it): a hash of the
table seed, the row's id, the table version and the column, ``row_noise`` and
``column_word``.

``load_value`` / ``store_value`` (and ``copy_row_out`` / ``write_initial_values``)
are what the kernels call: for a float32 row array they are the plain index
(the kernels compile to what they were before half rows existed); for a uint16
one they convert, by ``fmt``: F16 or BF16, plus STOCHASTIC.
"""
from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic, overload

from .hashing import GOLDEN, mix64
from .initial_rows import write_initial_row

F32, F16, BF16 = 0, 1, 2        # storage formats (the low two bits of ``fmt``)
STOCHASTIC = 4                  # rounding flag
S32 = np.uint64(32)
TWO_24 = np.float32(16777216.0)
INV_TWO_24 = np.float32(1.0 / 16777216.0)


# -- float32 <-> its bits, in registers ---------------------------------------
@intrinsic
def f32_bits(typingctx, x):
    """The 32 bits of a float32, as a uint32 (no conversion, no memory)."""
    if not isinstance(x, types.Float) or x.bitwidth != 32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.uint32(x), codegen


@intrinsic
def bits_f32(typingctx, u):
    """The float32 whose bits are the low 32 bits of integer ``u``."""
    if not isinstance(u, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        v = args[0]
        if u.bitwidth > 32:
            v = builder.trunc(v, ir.IntType(32))
        elif u.bitwidth < 32:
            v = builder.zext(v, ir.IntType(32))
        return builder.bitcast(v, ir.FloatType())
    return types.float32(u), codegen


# -- the conversions ------------------------------------------------------------
@numba.njit(cache=True, error_model="numpy")
def f32_to_f16(x):
    """float32 -> float16 bits, round to nearest even."""
    f = np.int64(f32_bits(x))
    sign = (f >> 16) & 0x8000
    a = f & 0x7FFFFFFF
    if a >= 0x7F800000:                          # inf, NaN
        if a == 0x7F800000:
            return np.uint16(sign | 0x7C00)
        payload = (a & 0x7FFFFF) >> 13
        return np.uint16(sign | 0x7C00 | (payload if payload != 0 else 1))
    if a >= 0x477FF000:                          # >= 65520: past the largest finite half
        return np.uint16(sign | 0x7C00)
    if a >= 0x38800000:                          # >= 2**-14: a normal half; 13 bits go
        return np.uint16(sign | (((a + 0xFFF + ((a >> 13) & 1)) >> 13) - 0x1C000))
    if a < 0x33000000:                           # < 2**-25: rounds to zero (2**-25 ties to 0)
        return np.uint16(sign)
    shift = 126 - (a >> 23)                      # a subnormal half: units of 2**-24; 14..24 bits go
    m = (a & 0x7FFFFF) | 0x800000
    q = m >> shift
    rest = m & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    if rest > half or (rest == half and (q & 1) == 1):
        q += 1
    return np.uint16(sign | q)


@numba.njit(cache=True, error_model="numpy")
def f16_to_f32(h):
    """float16 bits -> float32 (exact)."""
    h = np.int64(h)
    sign = (h & 0x8000) << 16
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0x1F:
        return bits_f32(sign | 0x7F800000 | (m << 13))
    if e != 0:
        return bits_f32(sign | ((e + 112) << 23) | (m << 13))
    v = np.float32(m) * INV_TWO_24                 # a subnormal half: exact in float32
    return -v if sign != 0 else v


@numba.njit(cache=True, error_model="numpy")
def f32_to_bf16(x):
    """float32 -> bfloat16 bits, round to nearest even."""
    f = np.int64(f32_bits(x))
    if (f & 0x7FFFFFFF) > 0x7F800000:
        return np.uint16((f >> 16) | 0x40)
    return np.uint16((f + 0x7FFF + ((f >> 16) & 1)) >> 16)


@numba.njit(cache=True, error_model="numpy")
def bf16_to_f32(h):
    """bfloat16 bits -> float32 (exact)."""
    return bits_f32(np.int64(h) << 16)


@numba.njit(cache=True, error_model="numpy")
def f32_to_f16_stochastic(x, w):
    """float32 -> float16 bits, rounded away from zero with probability p (above) by the
    random word ``w`` (0 <= w < 2**32)."""
    f = np.int64(f32_bits(x))
    a = f & 0x7FFFFFFF
    if a >= 0x7F800000:
        return f32_to_f16(x)
    sign = (f >> 16) & 0x8000
    word = np.int64(w)
    if a >= 0x38800000:                          # a normal half (or past it): p = (a & 0x1FFF) / 2**13
        t = (a >> 13) - 0x1C000
        if (word >> 19) < (a & 0x1FFF):
            t += 1
        return np.uint16(sign | min(t, 0x7C00))
    y = np.abs(x) * TWO_24                       # in units of the subnormal spacing: exact
    lo = np.int64(y)
    p24 = (y - np.float32(lo)) * TWO_24          # p * 2**24, exact
    if np.float32(word >> 8) < p24:
        lo += 1
    return np.uint16(sign | lo)


@numba.njit(cache=True, error_model="numpy")
def f32_to_bf16_stochastic(x, w):
    """float32 -> bfloat16 bits, rounded away from zero with probability (bits & 0xFFFF) / 2**16."""
    f = np.int64(f32_bits(x))
    if (f & 0x7FFFFFFF) > 0x7F800000:
        return np.uint16((f >> 16) | 0x40)
    up = 1 if (np.int64(w) >> 16) < (f & 0xFFFF) else 0
    return np.uint16((f >> 16) + up)


@numba.njit(cache=True, error_model="numpy")
def decode(h, fmt):
    if (fmt & 3) == F16:
        return f16_to_f32(h)
    return bf16_to_f32(h)


@numba.njit(cache=True, error_model="numpy")
def column_word(noise, j):
    """The 32 random bits of column ``j`` of a row whose noise is ``noise`` (row_noise)."""
    return np.int64(mix64(noise + np.uint64(j + 1) * GOLDEN) >> S32)


@numba.njit(cache=True, error_model="numpy")
def encode(x, fmt, noise, j):
    if (fmt & STOCHASTIC) != 0:
        w = column_word(noise, j)
        if (fmt & 3) == F16:
            return f32_to_f16_stochastic(x, w)
        return f32_to_bf16_stochastic(x, w)
    if (fmt & 3) == F16:
        return f32_to_f16(x)
    return f32_to_bf16(x)


# -- what the kernels call: plain indexing for float32 rows, conversions for uint16 ------
def load_value(values, r, j, fmt):
    """values[r, j] as a float32."""
    raise NotImplementedError("compiled code only")


def store_value(values, r, j, x, fmt, noise):
    """values[r, j] = float32 ``x``, rounded to the row format."""
    raise NotImplementedError("compiled code only")


def row_noise(values, keys, r, fmt, salt, version_key):
    """The per-row part of the random words of an update of row ``r`` (0 unless stochastic)."""
    raise NotImplementedError("compiled code only")


def copy_row_out(values, r, out, fmt):
    """out[:] = row ``r`` as float32."""
    raise NotImplementedError("compiled code only")


def write_initial_values(values, r, scratch, key, salt, two_scale, scale, fmt):
    """Row ``r`` = the initial row of ``key`` (initial_rows.py), rounded to the row format."""
    raise NotImplementedError("compiled code only")


def _is_f32(values) -> bool:
    return isinstance(values, types.Array) and values.dtype == types.float32


def _is_half(values) -> bool:
    return isinstance(values, types.Array) and values.dtype == types.uint16


@overload(load_value, inline="always", jit_options={"error_model": "numpy"})
def _load_value(values, r, j, fmt):
    if _is_f32(values):
        return lambda values, r, j, fmt: values[r, j]
    if _is_half(values):
        return lambda values, r, j, fmt: decode(values[r, j], fmt)
    return None


@overload(store_value, inline="always", jit_options={"error_model": "numpy"})
def _store_value(values, r, j, x, fmt, noise):
    if _is_f32(values):
        def f32(values, r, j, x, fmt, noise):
            values[r, j] = x
        return f32
    if _is_half(values):
        def half(values, r, j, x, fmt, noise):
            values[r, j] = encode(x, fmt, noise, j)
        return half
    return None


@overload(row_noise, inline="always", jit_options={"error_model": "numpy"})
def _row_noise(values, keys, r, fmt, salt, version_key):
    if _is_f32(values):
        return lambda values, keys, r, fmt, salt, version_key: np.uint64(0)
    if _is_half(values):
        def half(values, keys, r, fmt, salt, version_key):
            if (fmt & STOCHASTIC) != 0:
                return mix64(mix64(keys[r] ^ salt) + version_key)
            return np.uint64(0)
        return half
    return None


@overload(copy_row_out, inline="always", jit_options={"error_model": "numpy"})
def _copy_row_out(values, r, out, fmt):
    if _is_f32(values):
        def f32(values, r, out, fmt):
            src = values[r]
            for j in range(len(src)):
                out[j] = src[j]
        return f32
    if _is_half(values):
        def half(values, r, out, fmt):
            src = values[r]
            if (fmt & 3) == F16:
                for j in range(len(src)):
                    out[j] = f16_to_f32(src[j])
            else:
                for j in range(len(src)):
                    out[j] = bf16_to_f32(src[j])
        return half
    return None


@overload(write_initial_values, inline="always", jit_options={"error_model": "numpy"})
def _write_initial_values(values, r, scratch, key, salt, two_scale, scale, fmt):
    if _is_f32(values):
        def f32(values, r, scratch, key, salt, two_scale, scale, fmt):
            write_initial_row(values[r], key, salt, two_scale, scale)
        return f32
    if _is_half(values):
        def half(values, r, scratch, key, salt, two_scale, scale, fmt):
            write_initial_row(scratch, key, salt, two_scale, scale)
            for j in range(len(scratch)):
                values[r, j] = encode(scratch[j], fmt & 3, np.uint64(0), j)      # creation: nearest
        return half
    return None


# -- whole arrays (creation, imports, pages) --------------------------------------
@numba.njit(cache=True, error_model="numpy")
def encode_rows_kernel(src, out, fmt):
    """out[i, j] = src[i, j] rounded to the format (nearest: creation never rounds at random)."""
    for i in range(src.shape[0]):
        for j in range(src.shape[1]):
            out[i, j] = encode(src[i, j], fmt & 3, np.uint64(0), j)


@numba.njit(cache=True, error_model="numpy")
def decode_rows_kernel(src, out, fmt):
    for i in range(src.shape[0]):
        for j in range(src.shape[1]):
            out[i, j] = decode(src[i, j], fmt)


@numba.njit(cache=True, error_model="numpy")
def encode_kernel(src, words, out, fmt):
    """Flat float32 ``src`` -> bits ``out``; ``words``: each value's random word (stochastic)."""
    for i in range(len(src)):
        if (fmt & STOCHASTIC) != 0:
            if (fmt & 3) == F16:
                out[i] = f32_to_f16_stochastic(src[i], words[i])
            else:
                out[i] = f32_to_bf16_stochastic(src[i], words[i])
        elif (fmt & 3) == F16:
            out[i] = f32_to_f16(src[i])
        else:
            out[i] = f32_to_bf16(src[i])


@numba.njit(cache=True, error_model="numpy")
def decode_kernel(src, out, fmt):
    for i in range(len(src)):
        out[i] = decode(src[i], fmt)


def to_bits(values: np.ndarray, fmt: int, words: np.ndarray | None = None) -> np.ndarray:
    """Flat or [n, dim] float32 -> uint16 bits of the same shape (the kernels' conversion)."""
    src = np.ascontiguousarray(values, np.float32)
    out = np.empty(src.shape, np.uint16)
    if words is None:
        words = np.zeros(0, np.uint32)
        fmt &= 3
    encode_kernel(src.reshape(-1), np.ascontiguousarray(words, np.uint32).reshape(-1), out.reshape(-1), fmt)
    return out


def from_bits(bits: np.ndarray, fmt: int) -> np.ndarray:
    src = np.ascontiguousarray(bits, np.uint16)
    out = np.empty(src.shape, np.float32)
    decode_kernel(src.reshape(-1), out.reshape(-1), fmt)
    return out
