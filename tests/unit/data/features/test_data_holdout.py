"""Holdout: a fixed, evenly spread part of the records; the two parts partition them, per shard
too, and TabularReader reads exactly one part (training rows and validation rows never meet)."""
import numpy as np
import pandas as pd
import pytest

from paramshard.data.features.batch import TabularBatch
from paramshard.data.features.fit import fit_schema
from paramshard.data.shards.holdout import Holdout
from paramshard.specs.schema import Column, Format, Label, Schema
from paramshard.data.readers.tabular import TabularReader
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


# -- the hold-out by content: what a shard task (DynamicShards) can compute ------------------------

def test_by_content_the_parts_partition_the_rows_and_ignore_the_column_order():
    rng = np.random.default_rng(1)
    columns = {"cat": rng.choice(["a", "b", "c", ""], 50_000).astype(object), "x": rng.normal(size=50_000),
               "id": np.array([str(i) for i in range(50_000)], object)}
    h = Holdout(0.1, seed=3, by="content")
    held, rest = h.other().rows_mask(columns), h.rows_mask(columns)
    assert not np.any(held & rest) and np.all(held | rest)
    assert abs(held.mean() - 0.1) < 0.005
    reordered = {name: columns[name] for name in ("x", "id", "cat")}
    np.testing.assert_array_equal(h.rows_mask(reordered), rest)
    assert not np.array_equal(Holdout(0.1, seed=4, by="content").rows_mask(columns), rest)
    # A row's part is a function of its fields alone: the same row anywhere, in any batch.
    some = {name: values[1234:1300] for name, values in columns.items()}
    np.testing.assert_array_equal(h.rows_mask(some), rest[1234:1300])


def test_the_two_rules_refuse_each_others_calls():
    with pytest.raises(ConfigError, match="by content"):
        Holdout(0.1, by="content").mask(np.arange(3))
    with pytest.raises(ConfigError, match="by record number"):
        Holdout(0.1).rows_mask({"a": np.zeros(3)})
    with pytest.raises(ConfigError, match="cannot be counted"):
        Holdout(0.1, by="content").per_shard(10, 2)
    with pytest.raises(ConfigError, match="one of record, content"):
        Holdout(0.1, by="line")


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_every_record_is_trained_or_held_out_once_however_the_tasks_cut_the_file(tmp_path, suffix):
    from paramshard.data.shards.tasks import split_files
    n = 700
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"id": np.arange(n), "cat": rng.choice(["a", "b"], n), "y": rng.integers(0, 2, n)})
    path = tmp_path / f"d.{suffix}"
    if suffix == "csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path, row_group_size=97)
    schema = fit_schema(Schema(Label("y"), [Column("id", transforms=[]), Column("cat", "categorical")],
                               format=Format(type=suffix if suffix == "parquet" else "csv")), [path])
    h = Holdout(0.2, seed=5, by="content")

    def ids(batches):
        batches = [b for b in batches if len(b)]
        return np.sort(TabularBatch.concat(batches).dense[:, 0]).astype(int).tolist() if batches else []

    # The chief's validation reader reads the held part of the whole file, statically.
    held = ids(TabularReader([path], schema, 64, holdout=h.other()))
    for task_bytes in (300, 1000, 1 << 20):
        reader = TabularReader([path], schema, 16, holdout=h)
        tasks = split_files([path], task_bytes, header=suffix == "csv")
        trained = ids(batch for task in tasks for batch, _ in reader.read_task(task))
        assert sorted(held + trained) == list(range(n)), task_bytes
        # The same split as a static reader of the training part: the rule is the rows', not the tasks'.
        assert trained == ids(TabularReader([path], schema, 64, holdout=h))
    assert 0.1 < len(held) / n < 0.3


def test_a_task_reader_refuses_the_hold_out_by_record_number(tmp_path):
    from paramshard.data.shards.tasks import split_files
    pd.DataFrame({"c": ["a", "b"], "y": [0, 1]}).to_csv(tmp_path / "d.csv", index=False)
    schema = fit_schema(Schema(Label("y"), [Column("c", "categorical")], format=Format()), [tmp_path / "d.csv"])
    reader = TabularReader([tmp_path / "d.csv"], schema, 4, holdout=Holdout(0.5))
    with pytest.raises(ConfigError, match="by record number cannot be applied"):
        reader.read_task(split_files([tmp_path / "d.csv"], 1 << 20, header=True)[0])
