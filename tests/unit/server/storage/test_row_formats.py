"""server/storage/row_formats.py, the numpy reference of half-precision rows, against the dict oracle's
one-value-at-a-time definitions (tests/unit/reference_row_store.py): rounding to nearest, stochastic
rounding from exact fractions, and the random words; and which formats a table may have."""
import numpy as np
import pytest

from paramshard.errors import ConfigError
from paramshard.server.storage import row_formats
from paramshard.tables import check_row_format

from tests.unit.reference_row_store import random_word, to_bfloat16, to_float16

ORACLE = {"float16": to_float16, "bfloat16": to_bfloat16}


def sample() -> np.ndarray:
    rng = np.random.default_rng(4)
    values = np.concatenate([
        rng.standard_normal(3000) * 10.0 ** rng.integers(-9, 6, 3000),
        np.ldexp(rng.random(2000), rng.integers(-40, -10, 2000)),             # float16 subnormals and below
        np.linspace(65490, 65550, 500), [0.0, 2.0 ** -24, 2.0 ** -25, 3.3895314e38, 1e-45]]).astype(np.float32)
    return np.concatenate([values, -values])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_reference_rounds_each_value_as_the_oracle_does(dtype):
    x = sample()
    words = np.random.default_rng(5).integers(0, 2**32, len(x), dtype=np.uint64).astype(np.uint32)
    to = ORACLE[dtype]
    nearest = row_formats.from_storage(row_formats.to_storage(x, dtype), dtype)
    np.testing.assert_array_equal(nearest, [to(v) for v in x])
    np.testing.assert_array_equal(row_formats.rounded(x, dtype), nearest)
    stochastic = row_formats.from_storage(row_formats.to_storage(x, dtype, words), dtype)
    np.testing.assert_array_equal(stochastic, [to(v, int(w)) for v, w in zip(x, words)])
    assert (stochastic != nearest).sum() > len(x) // 10


def test_random_words_are_the_documented_hash():
    ids = np.array([0, 1, 2**63 + 5, 2**64 - 1, 123456789], np.uint64)
    for seed, version in [(0, 0), (7, 1), (2**64 - 1, 10**9)]:
        words = row_formats.rounding_words(seed, ids, version, 5)
        assert words.dtype == np.uint32 and words.shape == (5, 5)
        assert words.tolist() == [[random_word(seed, int(i), version, j) for j in range(5)] for i in ids]
    w = row_formats.rounding_words(1, ids, 3, 4)
    assert not np.array_equal(w, row_formats.rounding_words(1, ids, 4, 4))      # each update: new bits
    assert not np.array_equal(w, row_formats.rounding_words(2, ids, 3, 4))      # each table: its own


def test_float32_rows_are_never_rounded_and_formats_are_checked():
    x = np.array([0.1, 1e-30], np.float32)
    assert row_formats.rounded(x, "float32") is x
    for dtype in ("float32", "float16", "bfloat16"):
        check_row_format("t", dtype, "nearest")
    check_row_format("t", "bfloat16", "stochastic")
    with pytest.raises(ConfigError, match="one of float32, float16, bfloat16, got 'float64'"):
        check_row_format("t", "float64", "nearest")
    with pytest.raises(ConfigError, match="rounding is one of nearest, stochastic"):
        check_row_format("t", "float16", "up")
    with pytest.raises(ConfigError, match="float32 rows are never rounded"):
        check_row_format("t", "float32", "stochastic")
