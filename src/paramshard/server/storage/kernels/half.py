"""Half-precision row values in compiled code: float16 and bfloat16 held as their uint16 bits.

numba has no float16 type, so a half table's row array is uint16 and every value
is converted here, in registers: a float32 is reinterpreted as its 32 bits (an
LLVM bitcast), rounded to 16 bits with integer operations and selects, and back.
The conversions are numba intrinsics that emit these few LLVM instructions where
they are called: no call, no branch, so a kernel's loop over a row's columns stays
a straight run of arithmetic (as numba functions they were calls, 2.5x slower).
The maths of an update stays float32; only loading a row value and storing the new
one convert. The conversions, exactly:

- float16, round to nearest even: IEEE binary16, subnormals kept, a value of
  magnitude >= 65520 becomes inf, NaN stays NaN with its top 10 payload bits
  (a payload that would vanish becomes 1), as numpy's ``astype(np.float16)``
  does (tests/unit/server/storage/kernels/test_half.py checks every class of float32 against it).
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

from paramshard.server.storage.kernels.hashing import GOLDEN, mix64
from paramshard.server.storage.kernels.initial_rows import write_initial_row

F32, F16, BF16 = 0, 1, 2        # storage formats (the low two bits of ``fmt``)
STOCHASTIC = 4                  # rounding flag
S32 = np.uint64(32)

I16, I32, I64, FLOAT = ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()


def _c(value: int) -> ir.Constant:
    return ir.Constant(I32, value)


def _as_i32(builder, value, ty):
    """An integer of any width as i32 (its low 32 bits, or zero-extended)."""
    if ty.bitwidth > 32:
        return builder.trunc(value, I32)
    if ty.bitwidth < 32:
        return builder.zext(value, I32)
    return value


# -- the conversions, as LLVM IR (i32 holds the 16 bits of a half) -------------------
def _f16_nearest(b, x):
    """float32 -> float16 bits, round to nearest even; NaN keeps its top 10 payload bits (1 when
    they are all zero), as numpy does."""
    f = b.bitcast(x, I32)
    sign = b.and_(b.lshr(f, _c(16)), _c(0x8000))
    a = b.and_(f, _c(0x7FFFFFFF))
    # a normal half (|x| >= 2**-14): 13 bits go, ties to even, the exponent rebiased
    odd = b.and_(b.lshr(a, _c(13)), _c(1))
    normal = b.sub(b.lshr(b.add(b.add(a, _c(0xFFF)), odd), _c(13)), _c(0x1C000))
    # a subnormal half: |x| + 0.5 rounds |x| to a multiple of 2**-24, ties to even (the
    # float32 addition does it); the bits past 0.5's are the half's
    tiny = b.icmp_unsigned("<", a, _c(0x38800000))
    magnitude = b.bitcast(b.select(tiny, a, _c(0)), FLOAT)
    subnormal = b.sub(b.bitcast(b.fadd(magnitude, ir.Constant(FLOAT, 0.5)), I32), _c(0x3F000000))
    payload = b.lshr(b.and_(a, _c(0x7FFFFF)), _c(13))
    nan = b.or_(_c(0x7C00), b.select(b.icmp_unsigned("==", payload, _c(0)), _c(1), payload))
    out = b.select(tiny, subnormal, normal)
    out = b.select(b.icmp_unsigned(">=", a, _c(0x477FF000)), _c(0x7C00), out)      # >= 65520: inf
    out = b.select(b.icmp_unsigned(">", a, _c(0x7F800000)), nan, out)
    return b.or_(out, sign)


def _f16_stochastic(b, x, w):
    """float32 -> float16 bits, away from zero iff (w >> 8) < p * 2**24."""
    f = b.bitcast(x, I32)
    sign = b.and_(b.lshr(f, _c(16)), _c(0x8000))
    a = b.and_(f, _c(0x7FFFFFFF))
    # a normal half: p = (a & 0x1FFF) / 2**13, so hi iff (w >> 19) < (a & 0x1FFF); past 65504: inf
    up = b.zext(b.icmp_unsigned("<", b.lshr(w, _c(19)), b.and_(a, _c(0x1FFF))), I32)
    normal = b.add(b.sub(b.lshr(a, _c(13)), _c(0x1C000)), up)
    normal = b.select(b.icmp_unsigned(">", normal, _c(0x7C00)), _c(0x7C00), normal)
    # a subnormal half: y = |x| * 2**24 (exact), lo = floor(y), p * 2**24 = (y - lo) * 2**24 (exact)
    tiny = b.icmp_unsigned("<", a, _c(0x38800000))
    y = b.fmul(b.bitcast(b.select(tiny, a, _c(0)), FLOAT), ir.Constant(FLOAT, 16777216.0))
    lo = b.fptoui(y, I32)
    p24 = b.fmul(b.fsub(y, b.uitofp(lo, FLOAT)), ir.Constant(FLOAT, 16777216.0))
    up = b.zext(b.fcmp_ordered("<", b.uitofp(b.lshr(w, _c(8)), FLOAT), p24), I32)
    out = b.select(tiny, b.add(lo, up), normal)
    out = b.select(b.icmp_unsigned(">=", a, _c(0x7F800000)), _f16_nearest(b, x), b.or_(out, sign))   # inf, NaN
    return out


def _bf16_nearest(b, x):
    """float32 -> bfloat16 bits: (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16; NaN -> (bits >> 16) | 0x40."""
    f = b.bitcast(x, I32)
    rounded = b.lshr(b.add(b.add(f, _c(0x7FFF)), b.and_(b.lshr(f, _c(16)), _c(1))), _c(16))
    nan = b.icmp_unsigned(">", b.and_(f, _c(0x7FFFFFFF)), _c(0x7F800000))
    return b.select(nan, b.or_(b.lshr(f, _c(16)), _c(0x40)), rounded)


def _bf16_stochastic(b, x, w):
    """float32 -> bfloat16 bits, away from zero iff (w >> 16) < (bits & 0xFFFF)."""
    f = b.bitcast(x, I32)
    up = b.zext(b.icmp_unsigned("<", b.lshr(w, _c(16)), b.and_(f, _c(0xFFFF))), I32)
    nan = b.icmp_unsigned(">", b.and_(f, _c(0x7FFFFFFF)), _c(0x7F800000))
    return b.select(nan, b.or_(b.lshr(f, _c(16)), _c(0x40)), b.add(b.lshr(f, _c(16)), up))


def _f16_to_f32(b, h):
    """float16 bits -> float32 (exact): the exponent rebiased; inf/NaN and subnormals fixed up."""
    o = b.shl(b.and_(h, _c(0x7FFF)), _c(13))
    exponent = b.and_(o, _c(0x0F800000))
    o = b.add(o, _c(112 << 23))
    special = b.add(o, _c(112 << 23))                                   # inf, NaN: exponent 255
    # a subnormal half m * 2**-24: (2**-14 * (1 + m / 1024)) - 2**-14, exact in float32
    subnormal = b.bitcast(b.fsub(b.bitcast(b.add(o, _c(1 << 23)), FLOAT), ir.Constant(FLOAT, 2.0 ** -14)), I32)
    out = b.select(b.icmp_unsigned("==", exponent, _c(0x0F800000)), special, o)
    out = b.select(b.icmp_unsigned("==", exponent, _c(0)), subnormal, out)
    return b.bitcast(b.or_(out, b.shl(b.and_(h, _c(0x8000)), _c(16))), FLOAT)


def _is_f16(b, fmt, ty):
    return b.icmp_unsigned("==", b.and_(_as_i32(b, fmt, ty), _c(3)), _c(F16))


@intrinsic
def encode_nearest(typingctx, x, fmt):
    """float32 ``x`` -> the uint16 bits of format ``fmt`` (F16 or BF16), rounded to nearest even."""
    if x != types.float32 or not isinstance(fmt, types.Integer):
        return None

    def codegen(context, b, signature, args):
        value, code = args
        bits = b.select(_is_f16(b, code, fmt), _f16_nearest(b, value), _bf16_nearest(b, value))
        return b.trunc(bits, I16)
    return types.uint16(x, fmt), codegen


@intrinsic
def encode_stochastic(typingctx, x, fmt, w):
    """float32 ``x`` -> the uint16 bits of format ``fmt``, rounded at random by word ``w`` (uint32)."""
    if x != types.float32 or not isinstance(fmt, types.Integer) or not isinstance(w, types.Integer):
        return None

    def codegen(context, b, signature, args):
        value, code, word = args
        word = _as_i32(b, word, w)
        bits = b.select(_is_f16(b, code, fmt), _f16_stochastic(b, value, word), _bf16_stochastic(b, value, word))
        return b.trunc(bits, I16)
    return types.uint16(x, fmt, w), codegen


@intrinsic
def decode(typingctx, h, fmt):
    """The uint16 bits ``h`` of format ``fmt`` as a float32 (exact)."""
    if not isinstance(h, types.Integer) or not isinstance(fmt, types.Integer):
        return None

    def codegen(context, b, signature, args):
        bits, code = args
        bits = b.and_(_as_i32(b, bits, h), _c(0xFFFF))
        bf16 = b.bitcast(b.shl(bits, _c(16)), FLOAT)
        return b.select(_is_f16(b, code, fmt), _f16_to_f32(b, bits), bf16)
    return types.float32(h, fmt), codegen


@numba.njit(cache=True, error_model="numpy", inline="always")
def column_word(noise, j):
    """The 32 random bits of column ``j`` of a row whose noise is ``noise`` (row_noise)."""
    return mix64(noise + np.uint64(j + 1) * GOLDEN) >> S32


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
            if fmt & STOCHASTIC:
                values[r, j] = encode_stochastic(x, fmt, column_word(noise, j))
            else:
                values[r, j] = encode_nearest(x, fmt)
        return half
    return None


@overload(row_noise, inline="always", jit_options={"error_model": "numpy"})
def _row_noise(values, keys, r, fmt, salt, version_key):
    if _is_f32(values):
        return lambda values, keys, r, fmt, salt, version_key: np.uint64(0)
    if _is_half(values):
        def half(values, keys, r, fmt, salt, version_key):
            noise = np.uint64(0)
            if fmt & STOCHASTIC:
                noise = mix64(mix64(keys[r] ^ salt) + version_key)
            return noise
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
            for j in range(len(src)):
                out[j] = decode(src[j], fmt)
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
                values[r, j] = encode_nearest(scratch[j], fmt)       # creation: always to nearest
        return half
    return None


# -- whole arrays (creation, imports, pages, tests) -------------------------------
@numba.njit(cache=True, error_model="numpy", nogil=True)
def encode_kernel(src, words, out, fmt):
    """Flat float32 ``src`` -> bits ``out``; ``words``: each value's random word (stochastic)."""
    if fmt & STOCHASTIC:
        for i in range(len(src)):
            out[i] = encode_stochastic(src[i], fmt, words[i])
    else:
        for i in range(len(src)):
            out[i] = encode_nearest(src[i], fmt)


@numba.njit(cache=True, error_model="numpy", nogil=True)
def decode_kernel(src, out, fmt):
    for i in range(len(src)):
        out[i] = decode(src[i], fmt)


def to_bits(values: np.ndarray, fmt: int, words: np.ndarray | None = None) -> np.ndarray:
    """Flat or [n, dim] float32 -> uint16 bits of the same shape (the kernels' conversion):
    to nearest, or with ``words`` (uint32, one a value) and STOCHASTIC in ``fmt`` at random."""
    src = np.ascontiguousarray(values, np.float32)
    out = np.empty(src.shape, np.uint16)
    if words is None:
        words, fmt = np.zeros(0, np.uint32), fmt & 3
    encode_kernel(src.reshape(-1), np.ascontiguousarray(words, np.uint32).reshape(-1), out.reshape(-1), fmt)
    return out


def from_bits(bits: np.ndarray, fmt: int) -> np.ndarray:
    src = np.ascontiguousarray(bits, np.uint16)
    out = np.empty(src.shape, np.float32)
    decode_kernel(src.reshape(-1), out.reshape(-1), fmt)
    return out
