"""server/storage/kernels/half.py: the compiled float32 <-> float16 / bfloat16 conversions, bit for bit
against numpy's float16 (nearest), the bfloat16 formula, and the numpy reference of stochastic
rounding (server/storage/row_formats.py), on a million random float32 bit patterns plus every hard case:
subnormals, ties, the overflow edge, +-inf, NaN."""
import numpy as np
import pytest

from paramshard.server.storage import row_formats
from paramshard.server.storage.kernels.half import BF16, F16, STOCHASTIC, from_bits, to_bits


def hard_values() -> np.ndarray:
    rng = np.random.default_rng(11)
    every_bits = rng.integers(0, 2**32, 1_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    halves = np.arange(0x7C00, dtype=np.uint16).view(np.float16).astype(np.float32)       # every finite half
    with np.errstate(over="ignore"):
        spacing = np.spacing(np.arange(0x7C00, dtype=np.uint16).view(np.float16)).astype(np.float32)
    ties = halves + spacing / 2                       # exactly half way to the next half: ties to even
    near_ties = np.concatenate([np.nextafter(ties, np.float32(0)), np.nextafter(ties, np.float32(np.inf))])
    small = np.ldexp(rng.random(200_000), rng.integers(-54, -12, 200_000)).astype(np.float32)   # subnormal halves
    edge = np.linspace(65500, 65540, 20_001, dtype=np.float32)          # past 65504: 65520 ties to inf
    bf16_ties = (rng.integers(0, 2**16, 100_000, dtype=np.uint32) << 16 | 0x8000).view(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504, 65519.996, 65520, 65536, 3.4028235e38,
                        2.0 ** -14, 2.0 ** -24, 2.0 ** -25, 1.5 * 2.0 ** -25, 2.0 ** -26, 1e-45, -1e-45], np.float32)
    signaling = np.array([0x7F800001, 0xFF800001, 0x7F801FFF, 0x7FA00000, 0x7FFFFFFF], np.uint32).view(np.float32)
    values = np.concatenate([every_bits, halves, ties, near_ties, small, edge, bf16_ties, special, signaling])
    return np.concatenate([values, -values])


VALUES = hard_values()
NAN = np.isnan(VALUES)


def assert_same_bits(got: np.ndarray, expected: np.ndarray, what: str) -> None:
    bad = np.flatnonzero(got != expected)
    assert len(bad) == 0, (f"{what}: {len(bad)} values differ, e.g. "
                           f"{[(hex(VALUES.view(np.uint32)[i]), hex(got[i]), hex(expected[i])) for i in bad[:5]]}")


def test_float16_to_nearest_is_numpys_float16():
    got = to_bits(VALUES, F16)
    with np.errstate(over="ignore"):
        expected = VALUES.astype(np.float16).view(np.uint16)
    assert_same_bits(got[~NAN], expected[~NAN], "float16")
    # NaN: a NaN of the same sign, its top 10 payload bits (1 when they are all zero), as numpy's
    # own conversion does (compared by the formula: a numpy built with F16C may quieten them).
    bits = VALUES[NAN].view(np.uint32)
    payload = (bits >> 13) & 0x3FF
    formula = ((bits >> 16) & 0x8000) | 0x7C00 | np.where(payload == 0, 1, payload)
    assert_same_bits(got[NAN], formula.astype(np.uint16), "float16 NaN")
    assert np.isnan(got[NAN].view(np.float16)).all()


def test_bfloat16_to_nearest_is_the_rounding_formula():
    bits = VALUES.view(np.uint32).astype(np.uint64)
    expected = ((bits + 0x7FFF + ((bits >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)).astype(np.uint16)
    expected[NAN] = ((bits[NAN] >> np.uint64(16)) | np.uint64(0x40)).astype(np.uint16)      # quiet NaN
    got = to_bits(VALUES, BF16)
    assert_same_bits(got, expected, "bfloat16")
    assert_same_bits(got, row_formats.to_storage(VALUES, "bfloat16"), "bfloat16 (reference)")
    assert np.isnan(from_bits(got[NAN], BF16)).all()


@pytest.mark.parametrize("fmt", [F16, BF16], ids=["float16", "bfloat16"])
def test_every_half_converts_back_exactly(fmt):
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    got = from_bits(every, fmt)
    if fmt == F16:
        expected = every.view(np.float16).astype(np.float32)
    else:
        expected = (every.astype(np.uint32) << 16).view(np.float32)
    nan = np.isnan(expected)
    assert (got.view(np.uint32)[~nan] == expected.view(np.uint32)[~nan]).all()
    assert np.isnan(got[nan]).all()
    assert_same_bits(to_bits(got, fmt)[~nan], every[~nan], "round trip")      # every half survives a round trip


@pytest.mark.slow_unit(reason="rounds enough values to compare the rounding's statistics with the references'")
@pytest.mark.parametrize("dtype, fmt", [("float16", F16), ("bfloat16", BF16)])
def test_stochastic_rounding_is_the_references(dtype, fmt):
    """The compiled conversion and the numpy reference, from the same random words: the same bits;
    each result is one of the two neighbours of the value."""
    words = np.random.default_rng(3).integers(0, 2**32, len(VALUES), dtype=np.uint64).astype(np.uint32)
    got = to_bits(VALUES, fmt | STOCHASTIC, words)
    expected = row_formats.to_storage(VALUES, dtype, words).view(np.uint16)
    assert_same_bits(got[~NAN], expected[~NAN], f"{dtype} stochastic")
    assert np.isnan(from_bits(got[NAN], fmt)).all()
    finite = np.isfinite(VALUES)
    if fmt == F16:
        finite &= np.abs(VALUES) < 65536          # from 65536 on a float16 is inf whatever the bits (p >= 1)
    x, rounded = VALUES[finite].astype(np.float64), from_bits(got[finite], fmt).astype(np.float64)
    nearest = from_bits(to_bits(VALUES[finite], fmt), fmt).astype(np.float64)
    down, up = to_bits(VALUES[finite], fmt | STOCHASTIC, np.full(finite.sum(), 2**32 - 1, np.uint32)), \
        to_bits(VALUES[finite], fmt | STOCHASTIC, np.zeros(finite.sum(), np.uint32))
    toward, away = from_bits(down, fmt).astype(np.float64), from_bits(up, fmt).astype(np.float64)
    assert (np.abs(toward) <= np.abs(x)).all() and (np.abs(away) >= np.abs(x)).all()
    assert ((rounded == toward) | (rounded == away)).all()
    assert ((nearest == toward) | (nearest == away)).all()
    assert (rounded != nearest).any()
