"""Side columns (issue 32: --weight, --group-by): every reader path carries each row's weight and
group key with that row (shuffled, bagged, by tasks, held out), never as a feature; bad weights
are bad lines."""
import numpy as np
import pandas as pd
import pytest

from paramshard.data.errors import DataFormatError
from paramshard.data.features.batch import TabularBatch
from paramshard.data.features.hashing import feature_ids
from paramshard.data.features.side_columns import SideColumns
from paramshard.data.readers.tabular import TabularReader
from paramshard.data.shards.holdout import Holdout
from paramshard.data.shards.tasks import split_files
from paramshard.specs.schema import Column, Label, Schema

N = 240
SIDE = SideColumns(weight="w", group="user")


def table() -> pd.DataFrame:
    rng = np.random.default_rng(4)
    return pd.DataFrame({"rid": np.arange(N), "user": [f"u{i % 13}" for i in range(N)],
                         "tags": rng.choice(["a|b", "b", "c|a|b"], N), "w": np.arange(N) * 0.5,
                         "y": rng.integers(0, 2, N)})


def schema() -> Schema:
    # rid: a plain number, so each batch row says which file row it is (dense[:, 0]).
    return Schema(Label("y"), [Column("rid"), Column("user", "categorical"), Column("tags", "multi"),
                               Column("w", "drop")])


@pytest.fixture(params=["csv", "parquet"])
def path(tmp_path, request):
    p = tmp_path / f"d.{request.param}"
    table().to_csv(p, index=False) if request.param == "csv" else table().to_parquet(p)
    return p


def check_rows(batch: TabularBatch, expected_rows=None):
    rid = batch.dense[:, 0].astype(int)
    np.testing.assert_array_equal(batch.extras["weight"], rid * 0.5)
    np.testing.assert_array_equal(batch.extras["group"], feature_ids("user", np.array([f"u{r % 13}" for r in rid],
                                                                                      dtype=object)))
    if expected_rows is not None:
        assert sorted(rid) == sorted(expected_rows)


def test_shuffled_bagged_batches_carry_each_rows_weight_and_group(path):
    reader = TabularReader([path], schema(), 16, shuffle=True, shuffle_buffer=50, seed=3, side=SIDE)
    batches = list(reader)
    assert batches[0].offsets is not None            # the bag path (a multi column)
    assert batches[0].num_fields == 2 and batches[0].dense.shape[1] == 1      # the weight is no feature
    check_rows(TabularBatch.concat(batches), range(N))
    t = batches[0].torch()
    assert t["sample_weight"].dtype.is_floating_point and "group" not in t
    np.testing.assert_array_equal(t["sample_weight"].numpy(), batches[0].extras["weight"].astype(np.float32))


def test_without_side_columns_batches_are_as_before(path):
    plain = TabularBatch.concat(list(TabularReader([path], schema(), 16)))
    side = TabularBatch.concat(list(TabularReader([path], schema(), 16, side=SIDE)))
    assert plain.extras is None and "sample_weight" not in plain.torch()
    for name in ("labels", "dense", "ids", "offsets", "weights"):
        np.testing.assert_array_equal(getattr(plain, name), getattr(side, name))


def test_tasks_and_a_hold_out_by_content_carry_them_and_the_split_does_not_move(path):
    held = Holdout(0.3, seed=1, by="content")
    rest_plain = TabularBatch.concat(list(TabularReader([path], schema(), 16, holdout=held)))
    rest = [b for t in split_files([path], 900, header=True) for b, _ in
            TabularReader([path], schema(), 16, holdout=held, side=SIDE).read_task(t) if len(b)]
    other = TabularBatch.concat(list(TabularReader([path], schema(), 16, holdout=held.other(), side=SIDE)))
    rest = TabularBatch.concat(rest)
    # The same training rows with the side columns read as without: they are not hashed.
    assert sorted(rest.dense[:, 0]) == sorted(rest_plain.dense[:, 0])
    check_rows(rest)
    check_rows(other)
    assert len(rest) + len(other) == N and 0 < len(other) < N


@pytest.mark.parametrize("bad", ["-1", "x", "", "inf"])
def test_a_bad_weight_is_a_bad_line_named_by_its_line(tmp_path, bad):
    p = tmp_path / "bad.csv"
    p.write_text(f"rid,user,tags,w,y\n1,u1,a,1.5,1\n2,u2,b,{bad},0\n")
    with pytest.raises(DataFormatError, match=r"bad.csv:3.*weight column 'w'"):
        list(TabularReader([p], schema(), 4, side=SIDE))
    reader = TabularReader([p], schema(), 4, side=SIDE, skip_bad_lines=True)
    got = TabularBatch.concat(list(reader))
    assert reader.bad_lines == 1 and list(got.extras["weight"]) == [1.5]
