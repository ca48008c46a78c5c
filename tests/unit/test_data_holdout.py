"""Holdout: a fixed, evenly spread part of the records; the two parts partition them, per shard
too, and TabularReader reads exactly one part (training rows and validation rows never meet)."""
import numpy as np
import pandas as pd
import pytest

from paramshard.data.batch import TabularBatch
from paramshard.data.fit import fit_schema
from paramshard.data.holdout import Holdout
from paramshard.data.schema import Column, Format, Label, Schema
from paramshard.data.tabular import TabularReader
from paramshard.errors import ConfigError


def test_the_two_parts_partition_the_records_and_hold_about_the_fraction():
    records = np.arange(200_000)
    held = Holdout(0.1, seed=3, part="held").mask(records)
    rest = Holdout(0.1, seed=3).mask(records)
    assert not np.any(held & rest) and np.all(held | rest)
    assert abs(held.mean() - 0.1) < 0.005
    # Spread over the file, not a block: every tenth of it holds about its share.
    assert all(abs(part.mean() - 0.1) < 0.02 for part in np.array_split(held, 10))


def test_the_choice_depends_on_the_seed_only():
    records = np.arange(10_000)
    a, b = Holdout(0.2, seed=1).mask(records), Holdout(0.2, seed=1).mask(records)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, Holdout(0.2, seed=2).mask(records))
    assert Holdout(0.2, seed=1).other() == Holdout(0.2, seed=1, part="held")


@pytest.mark.parametrize("total,shards", [(0, 1), (1, 1), (1000, 3), (12_345, 4)])
def test_per_shard_counts_equal_a_count_by_hand(total, shards):
    h = Holdout(0.25, seed=7)
    records = np.arange(total)
    expected = [int(np.count_nonzero(h.mask(records) & (records % shards == i))) for i in range(shards)]
    assert h.per_shard(total, shards).tolist() == expected


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, 1.5])
def test_a_fraction_outside_0_1_is_refused(bad):
    with pytest.raises(ConfigError, match="between 0 and 1"):
        Holdout(bad)


def test_reader_parts_partition_the_rows_over_shards(tmp_path):
    n = 500
    rng = np.random.default_rng(0)
    pd.DataFrame({"id": np.arange(n), "cat": rng.choice(["a", "b"], n), "y": rng.integers(0, 2, n)}) \
        .to_csv(tmp_path / "d.csv", index=False)
    schema = fit_schema(Schema(Label("y"), [Column("id", transforms=[]), Column("cat", "categorical")],
                               format=Format()), [tmp_path / "d.csv"])
    h = Holdout(0.2, seed=5)

    def ids(reader):
        return np.sort(TabularBatch.concat(list(reader)).dense[:, 0]).astype(int).tolist()

    held = ids(TabularReader([tmp_path / "d.csv"], schema, 64, holdout=h.other()))
    train = sorted(sum((ids(TabularReader([tmp_path / "d.csv"], schema, 64, shard=(i, 3), holdout=h))
                        for i in range(3)), []))
    assert sorted(held + train) == list(range(n))
    assert held == np.flatnonzero(h.other().mask(np.arange(n))).tolist()
    # equal_steps counts the smallest shard's share of the training part.
    steps = [len(TabularReader([tmp_path / "d.csv"], schema, 16, shard=(i, 3), holdout=h, equal_steps=True))
             for i in range(3)]
    assert steps == [int(h.per_shard(n, 3).min()) // 16] * 3


def test_an_empty_training_file_names_the_real_problem(tmp_path):
    (tmp_path / "d.csv").write_text("id,cat,y\n")
    schema = Schema(Label("y"), [Column("cat", "categorical")], format=Format())
    with pytest.raises(ConfigError, match="no data rows") as err:
        TabularReader([tmp_path / "d.csv"], schema, 16, equal_steps=True)
    assert "batch-size" not in str(err.value)
