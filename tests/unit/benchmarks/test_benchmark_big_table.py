"""benchmarks/big_table.py's pure parts: the memory bounds, the refusal line, the arguments (no servers)."""

import numpy as np
import pytest

from tests.unit.benchmark_scripts import import_script, on_the_path

B = import_script("big_table")

GiB = 1 << 30


@pytest.fixture(scope="module", autouse=True)
def _benchmarks_on_the_path_meanwhile():
    with on_the_path():        # a spawned child imports the script from there
        yield


def test_state_bytes_come_from_the_update_rules():
    assert B.state_bytes("sgd", 16) == (0, 0)
    assert B.state_bytes("adagrad", 16) == (64, 0)
    assert B.state_bytes("rowwise_adagrad", 16) == (4, 0)


def test_the_numpy_estimate_is_unchanged_for_sgd():
    # the pre-existing formula: (dim*4 + 4) * rows * 1.25 + 12 B per bucket; peak adds a copy, half the index, 2 GiB
    rows, dim = 50_000_000, 8
    buckets = 1 << 26
    final = 36 * rows * 1.25 + 12 * buckets
    assert B.estimate_bytes(rows, dim) == (int(final), int(final + 36 * rows * 1.25 + 6 * buckets + 2 * GiB))
    assert B.estimate_bytes(rows, dim, 4)[0] > B.estimate_bytes(rows, dim)[0]


def test_the_compiled_bound_follows_the_row_layout():
    assert B.compiled_row_bytes(16, 4) == pytest.approx(8 + 64 + 4 + 8 / 0.375)
    assert B.compiled_bound(0, 16) == GiB
    assert B.server_bound("compiled", 100_000_000, 2, 16, "rowwise_adagrad") == \
        int(50_000_000 * (8 + 64 + 4 + 8 / 0.375)) + GiB
    assert B.total_bound("compiled", 100_000_000, 2, 16, "sgd") == 2 * B.compiled_bound(50_000_000, 16)
    assert B.rows_per_server(7, 2) == 4


@pytest.mark.slow_unit(reason="allocates a compiled store of 2^20 rows for every optimizer")
def test_the_compiled_row_arrays_are_what_the_bound_counts():
    from paramshard.server.storage.compiled_row_store import CompiledRowStore
    from paramshard.update_rules import make_rule
    for kind in B.OPTIMIZERS:
        store = CompiledRowStore(16, make_rule(B.optimizer(kind)), keep_last_seen=False, count_admissions=False,
                                 max_rows=1 << 20)
        slots, steps = B.state_bytes(kind, 16)
        assert store.bytes_per_row == 8 + 64 + slots + steps, kind


@pytest.mark.parametrize("store", B.STORES)
def test_largest_rows_is_the_boundary(store):
    avail = 20 * GiB
    n = B.largest_rows(store, 2, 16, "rowwise_adagrad", avail)
    assert n > 0
    assert B.total_bound(store, n, 2, 16, "rowwise_adagrad") <= avail
    assert B.total_bound(store, n + 1, 2, 16, "rowwise_adagrad") > avail
    assert B.largest_rows(store, 2, 16, "sgd", GiB // 2) == 0


def test_refusal_is_one_line_with_the_estimate_and_the_largest_rows():
    avail = 12 * GiB
    assert B.refusal(["compiled"], 100_000_000, 2, 16, "sgd", avail) is None
    line = B.refusal(["compiled", "numpy"], 100_000_000, 2, 16, "sgd", avail)
    assert line is not None and "\n" not in line
    largest = min(B.largest_rows(s, 2, 16, "sgd", avail) for s in ("compiled", "numpy"))
    assert f"{largest:,}" in line and "12.0 GiB" in line
    assert f"{B.total_bound('numpy', 100_000_000, 2, 16, 'sgd') / GiB:.1f} GiB (numpy)" in line
    lines = B.bound_lines(["compiled", "numpy"], 100_000_000, 2, 16, "sgd", avail)
    assert len(lines) == 3 and lines[2].endswith("does not fit") and not lines[1].endswith("does not fit")


def test_arguments():
    assert B.parse_args([]).store_list == ["compiled"]
    o = B.parse_args(["--stores", "compiled,numpy", "--store", "numpy", "--servers", "2"])
    assert o.store_list == ["compiled", "numpy"] and o.servers == 2 and not o.longest_request
    assert B.parse_args(["--store", "numpy"]).store_list == ["numpy"]
    for bad in (["--stores", "compiled,nope"], ["--stores", "numpy,numpy"], ["--servers", "0"],
                ["--optimizer", "adam"]):
        with pytest.raises(SystemExit):
            B.parse_args(bad)


def test_request_summary():
    s = B.request_summary([0.01] * 99 + [1.0])
    assert s["longest"] == 1.0 and s["median"] == 0.01 and s["count"] == 100
    assert s["p99"] == pytest.approx(np.percentile([0.01] * 99 + [1.0], 99))
