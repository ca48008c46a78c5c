"""benchmarks/online_exactly_once.py's comparison of two final models: bit for bit, or what differs."""
import numpy as np

from tests.unit.benchmark_scripts import import_script

bench = import_script("online_exactly_once")


def state(rows, dense, ids=(1, 5, 9)):
    return {"tables": {"emb": (np.array(ids, np.uint64), np.array(rows, np.float32))},
            "dense": {"w": np.array(dense, np.float32)}}


def test_identical_models_compare_equal_and_any_difference_is_named_with_how_far():
    reference = state([[1, 2], [3, 4], [5, 6]], [0.5, 0.25])
    assert bench.compare(state([[1, 2], [3, 4], [5, 6]], [0.5, 0.25]), reference) == []
    assert bench.compare(state([[1, 2], [3, 4.5], [5, 6]], [0.5, 0.5]), reference) == [
        "table emb: 1 of 3 rows differ (max |diff| 0.5)", "dense w: max |diff| 0.25"]
    # An id more or fewer is named before any row (the rows of other ids cannot be compared).
    assert bench.compare(state([[1, 2], [3, 4], [5, 6]], [0.5, 0.25], ids=(1, 5, 8)), reference) == [
        "table emb: 3 ids against 3, 2 in one only"]
    # Bit for bit: -0.0 is not 0.0, and a NaN row equals the same NaN row.
    assert bench.compare(state([[1, 2], [3, 4], [5, -0.0]], [0.5, 0.25]), state([[1, 2], [3, 4], [5, 0.0]],
                                                                                 [0.5, 0.25])) == [
        "table emb: 1 of 3 rows differ (max |diff| 0)"]
    nan = state([[1, 2], [3, 4], [5, np.nan]], [0.5, 0.25])
    assert bench.compare(nan, state([[1, 2], [3, 4], [5, np.nan]], [0.5, 0.25])) == []


def test_a_directory_that_lives_a_moment_is_seen_created(tmp_path):
    """The mid-save kill's trigger: a checkpoint's temporary directory, made and gone within the
    same instant, is reported (a poll of the directory missed saves of a few ms)."""
    created = bench.CreatedIn(tmp_path)
    try:
        (tmp_path / "other").mkdir()
        (tmp_path / ".tmp-step-00000020-ab").mkdir()
        (tmp_path / ".tmp-step-00000020-ab").rmdir()
        assert created.wait(".tmp-step-", 5.0)
        assert not created.wait(".tmp-step-", 0.2)       # nothing more was made
    finally:
        created.__exit__(None, None, None)
