"""The readers' ``read_task``: every task's batches together equal the whole-file read
(CriteoReader, LibsvmReader, TabularReader on CSV, .gz and Parquet), and the positions
they report let a remainder continue exactly."""
import numpy as np
import pandas as pd
import pytest

from paramshard.data import CriteoBatch, CriteoReader, LibsvmReader, SparseBatch, generate_criteo
from paramshard.data.features.batch import TabularBatch
from paramshard.data.features.fit import fit_schema
from paramshard.specs.schema import Column, Label, Schema
from paramshard.data.readers.tabular import TabularReader
from paramshard.data.shards.tasks import split_files


def by_tasks(reader, tasks):
    return [b for t in tasks for b, _ in reader.read_task(t) if len(b)]


@pytest.mark.parametrize("task_bytes", [37, 997, 5000, 1 << 30])
def test_criteo_tasks_equal_the_whole_file(tmp_path, task_bytes):
    path = tmp_path / "c.tsv"
    generate_criteo(path, 300, seed=2)
    whole = CriteoBatch.concat(list(CriteoReader([path], 64)))
    got = CriteoBatch.concat(by_tasks(CriteoReader([path], 64), split_files([path], task_bytes)))
    for name in ("labels", "dense", "sparse_ids"):
        np.testing.assert_array_equal(getattr(got, name), getattr(whole, name))


def test_libsvm_tasks_and_a_remainder(tmp_path):
    path = tmp_path / "a.svm"
    rng = np.random.default_rng(0)
    path.write_text("".join(f"{rng.integers(0, 2)} " + " ".join(f"{j}:{rng.random():.3f}" for j in
                                                                 sorted(rng.choice(50, rng.integers(1, 6), False)))
                            + "\n" for _ in range(200)))
    whole = SparseBatch.concat(list(LibsvmReader([path], 7)))
    tasks = split_files([path], 700)
    reader = LibsvmReader([path], 7)
    parts = []
    for t in tasks:
        it = reader.read_task(t)
        first, pos = next(it)
        parts.append(first)         # stop after one batch: the remainder goes on from ``pos``
        parts += [b for b, _ in LibsvmReader([path], 7).read_task(t.rest(pos))]
    got = SparseBatch.concat(parts)
    np.testing.assert_array_equal(got.labels, whole.labels)
    np.testing.assert_array_equal(got.ids, whole.ids)
    np.testing.assert_array_equal(got.offsets, whole.offsets)


def test_tabular_csv_gzip_and_parquet_tasks_equal_the_whole_read(tmp_path):
    rng = np.random.default_rng(1)
    df = pd.DataFrame({"id": np.arange(500), "x": rng.normal(size=500).round(3),
                       "cat": rng.choice(["u", "v"], 500), "y": rng.integers(0, 2, 500)})
    df.to_csv(tmp_path / "d.csv", index=False)
    df.to_csv(tmp_path / "d.csv.gz", index=False, compression="gzip")
    df.to_parquet(tmp_path / "d.parquet", row_group_size=64)
    schema = fit_schema(Schema(Label("y"), [Column("id", transforms=[]), Column("x"), Column("cat", "categorical")]),
                        [tmp_path / "d.csv"])
    whole = TabularBatch.concat(list(TabularReader([tmp_path / "d.csv"], schema, 50)))
    for name in ("d.csv", "d.csv.gz", "d.parquet"):
        paths = [tmp_path / name]
        reader = TabularReader(paths, schema, 50)
        tasks = split_files(paths, 600, header=True)
        got = TabularBatch.concat(by_tasks(reader, tasks))
        for field in ("labels", "dense", "ids"):
            np.testing.assert_array_equal(getattr(got, field), getattr(whole, field), err_msg=name)
        # a remainder from the second batch's reported position
        t = split_files(paths, 1 << 30, header=True)[0]
        it = reader.read_task(t)
        (a, _), (b, pos) = next(it), next(it)
        rest = TabularBatch.concat([b for b, _ in reader.read_task(t.rest(pos))])
        all_of_t = TabularBatch.concat([b for b, _ in reader.read_task(t)])
        np.testing.assert_array_equal(rest.dense, all_of_t.dense[len(a) + len(b):], err_msg=name)


def test_tabular_libsvm_preset_tasks_equal_the_whole_read(tmp_path):
    from paramshard.data import libsvm_schema
    path = tmp_path / "a.svm"
    path.write_text("".join(f"{i % 2} {i}:0.5 {i + 7}:2\n" for i in range(150)))
    schema = libsvm_schema()
    whole = TabularBatch.concat(list(TabularReader([path], schema, 16)))
    reader = TabularReader([path], schema, 16)
    got = TabularBatch.concat(by_tasks(reader, split_files([path], 250)))
    for field in ("labels", "ids", "offsets", "weights"):
        np.testing.assert_array_equal(getattr(got, field), getattr(whole, field))
