"""benchmarks/tier.py's pure parts: the stream, the sizes, the arguments (no processes)."""
import numpy as np
import pytest

from tests.unit.benchmark_scripts import import_script

T = import_script("tier")


def test_the_stream_is_the_same_in_every_process_and_zipf_shaped():
    a, b = T.zipf_batch(1, 3, 10_000, 10**9, 1.05), T.zipf_batch(1, 3, 10_000, 10**9, 1.05)
    assert a.dtype == np.uint64 and len(a) == 10_000 and np.array_equal(a, b)
    assert not np.array_equal(a, T.zipf_batch(1, 4, 10_000, 10**9, 1.05))
    _, counts = np.unique(a, return_counts=True)
    assert counts.max() > 500 and len(counts) > 3000          # a few ids very often, many once


def test_quick_and_full_defaults():
    quick, full = T.parse_args(["--quick"]), T.parse_args([])
    assert (quick.budget, quick.logical_ids, quick.batches, quick.dim) == (160 << 20, 10**8, 40, 32)
    assert (full.budget, full.logical_ids, full.batches, full.rounds, full.dim) == (4 * 10**9, 10**9, 600, 6, 64)
    assert T.table_bytes_per_row(64, "adagrad") == pytest.approx(8 + 256 + 256 + 8 / 0.375)
    with pytest.raises(Exception, match="--budget"):
        T.parse_args(["--budget", "lots"])


@pytest.mark.slow_unit(reason="fills a table to compare the benchmark's estimate with what it holds")
def test_the_table_estimate_is_from_above():
    args = T.parse_args(["--quick", "--batches", "40", "--batch", "20000"])
    seen = np.unique(np.concatenate([T.zipf_batch(args.seed, b, args.batch, args.logical_ids, args.exponent)
                                     for b in range(40)]))
    assert len(seen) <= T.estimate_rows(args) <= 1.3 * len(seen)
