"""Smoke test of benchmarks/row_store.py: every measure on tiny sizes, numpy store, in-process
(bytes_per_row, which spawns a child: tests/integration/test_benchmark_row_store_child.py)."""
import math

import pytest

from paramshard.server.storage.numpy_row_store import NumpyRowStore

from tests.unit.benchmark_scripts import import_script

R = import_script("row_store")

STORES = {"numpy": NumpyRowStore}
ROWS, GROWTH_BATCH = 20_000, 3_000


@pytest.fixture(scope="module")
def o():
    return R.parse_args(["--rows", str(ROWS), "--batch", "5000", "--ids", "2000", "--growth-batch",
                         str(GROWTH_BATCH), "--big-rows", "20000", "--small-rows", "5000", "--repeats", "1",
                         "--timeout", "60"], STORES)


def positive(x) -> bool:
    return math.isfinite(x) and x > 0


@pytest.mark.slow_unit(reason="runs the benchmark's timed rounds")
def test_rates_are_positive_and_finite(o):
    results = {"first_touch": R.first_touch(STORES, o), "gather": R.gather(STORES, o),
               "pull_push": R.pull_push(STORES, o), "size_ratio": R.size_ratio(STORES, o)}
    for measure in ("first_touch", "gather"):
        assert list(results[measure]) == ["numpy"] and len(results[measure]["numpy"]) == 1
        assert all(positive(x) for x in results[measure]["numpy"]), measure
    assert set(results["pull_push"]) == set(R.optimizer_kinds())
    for kind, res in results["pull_push"].items():
        assert list(res) == ["numpy"] and all(positive(x) for x in res["numpy"]), kind
    sizes = results["size_ratio"]["numpy"]
    assert all(positive(x) for x in sizes["big"] + sizes["small"])
    R.report(o, results, ["note"])          # the tables print


@pytest.mark.slow_unit(reason="runs the benchmark's timed rounds")
def test_the_embeddingbag_peer_runs_in_the_same_rounds(o):
    res = R.pull_push(STORES, o, peer=True, kinds=("sgd", "adam"))
    for kind in ("sgd", "adam"):
        assert set(res[kind]) == {"numpy", R.EBAG}
        assert all(positive(x) for xs in res[kind].values() for x in xs)
    alone = R.embeddingbag(STORES, o, kinds=("adagrad",))
    assert list(alone["adagrad"]) == [R.EBAG] and positive(alone["adagrad"][R.EBAG][0])


def test_growth_times_every_request(o):
    runs = R.growth(STORES, o)["numpy"]
    assert len(runs) == o.repeats
    for durations in runs:
        assert len(durations) == math.ceil(ROWS / GROWTH_BATCH)      # the last request is a short one
        assert all(positive(d) for d in durations)
        s = R.growth_summary(durations)
        assert s["median"] <= s["p99"] <= s["max"] and positive(s["total"])


def test_store_and_measure_names_are_checked():
    with pytest.raises(SystemExit):
        R.parse_args(["--stores", "numpy,nonesuch"], STORES)
    with pytest.raises(SystemExit):
        R.parse_args(["--only", "gather,nonesuch"], STORES)
    stores, source = R.available_stores()
    assert "numpy" in stores and source
