"""Smoke test of benchmarks/row_store.py's bytes_per_row, which measures in a spawned Python
process of its own (moved from tests/unit/test_benchmark_row_store.py, whose other measures run
in-process)."""
import math

import pytest

from paramshard.server.storage.numpy_row_store import NumpyRowStore
from tests.unit.benchmark_scripts import import_script, on_the_path

R = import_script("row_store")

STORES = {"numpy": NumpyRowStore}


@pytest.fixture(scope="module", autouse=True)
def _benchmarks_on_the_path_meanwhile():
    with on_the_path():        # the spawned child imports the script from there
        yield


@pytest.fixture(scope="module")
def o():
    return R.parse_args(["--rows", "20000", "--batch", "5000", "--ids", "2000", "--growth-batch", "3000",
                         "--big-rows", "20000", "--small-rows", "5000", "--repeats", "1", "--timeout", "60"], STORES)


def positive(x) -> bool:
    return math.isfinite(x) and x > 0


def test_bytes_per_row_in_a_fresh_process(o):
    res = R.bytes_per_row(STORES, o, kinds=("sgd",))
    (got,) = res["sgd"]["numpy"]
    assert got["bytes_per_row"] >= R.raw_bytes("sgd", o.dim) == o.dim * 4
    assert all(positive(got[k]) for k in ("bytes_per_row", "rss_per_row", "peak_per_row"))
