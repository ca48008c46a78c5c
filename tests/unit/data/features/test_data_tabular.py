"""TabularReader: the same batches from CSV, TSV (with or without header) and Parquet;
shards partition the rows; shuffle permutes them; equal steps; bad lines."""
import gzip

import numpy as np
import pandas as pd
import pytest

from paramshard.data.features.batch import TabularBatch
from paramshard.data.errors import DataFormatError
from paramshard.data.features.fit import fit_schema
from paramshard.specs.schema import Column, Format, Label, Schema
from paramshard.data.readers.tabular import TabularReader, count_records
from paramshard.errors import ConfigError


def frame(n=300, seed=1) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"id": np.arange(n), "x": rng.normal(size=n).round(4),
                         "cat": rng.choice(["u", "v", "w"], n), "y": rng.integers(0, 2, n)})


def schema(**fmt) -> Schema:
    return Schema(Label("y"), [Column("id", transforms=[]), Column("x", transforms=["standardize"], bucketize=4),
                               Column("cat", "categorical")], format=Format(**fmt))


@pytest.fixture
def files(tmp_path):
    df = frame()
    df.to_csv(tmp_path / "d.csv", index=False)
    df.to_csv(tmp_path / "d.tsv", sep="\t", index=False)
    df.to_csv(tmp_path / "noheader.tsv.gz", sep="\t", index=False, header=False, compression="gzip")
    df.to_parquet(tmp_path / "d.parquet")
    return df, tmp_path


def rows(reader) -> TabularBatch:
    return TabularBatch.concat(list(reader))


def same(a: TabularBatch, b: TabularBatch):
    for name in ("labels", "dense", "ids"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


def test_csv_tsv_and_parquet_give_identical_batches(files):
    df, d = files
    fitted = fit_schema(schema(), [d / "d.csv"])
    csv = list(TabularReader([d / "d.csv"], fitted, 64))
    for other in ([d / "d.tsv"], [d / "d.parquet"]):
        got = list(TabularReader(other, fitted, 64))
        assert [len(b) for b in got] == [len(b) for b in csv]
        for a, b in zip(csv, got):
            same(a, b)
    plain = Schema.from_dict({**fitted.to_dict(), "format": {"type": "tsv", "header": False,
                                                             "names": ["id", "x", "cat", "y"]}})
    same(rows(TabularReader([d / "noheader.tsv.gz"], plain, 64)), rows(csv))
    assert rows(csv).dense[:, 0].tolist() == df["id"].tolist()
    assert fit_schema(schema(), [d / "d.parquet"]).columns == fitted.columns   # fit agrees across formats


def test_shards_partition_the_rows_and_equal_steps_gives_every_trainer_the_same_count(files):
    df, d = files
    s = fit_schema(schema(), [d / "d.csv"])
    seen = []
    for t in range(3):
        r = TabularReader([d / "d.csv", d / "d.parquet"], s, 32, shard=(t, 3))
        ids = rows(r).dense[:, 0]
        assert (np.r_[df["id"], df["id"]][t::3] == ids).all()     # records t, t+3, ... across both files
        seen.append(len(ids))
        eq = TabularReader([d / "d.csv", d / "d.parquet"], s, 32, shard=(t, 3), equal_steps=True)
        assert len(eq) == (600 // 3) // 32 == len(list(eq)) and all(len(b) == 32 for b in eq)
    assert sum(seen) == 600
    assert count_records([d / "d.csv", d / "d.parquet"], s) == 600     # the header line is not a record


def test_shuffle_is_a_seeded_permutation_that_changes_per_pass(files):
    df, d = files
    s = fit_schema(schema(), [d / "d.csv"])
    r = TabularReader([d / "d.csv"], s, 50, shuffle=True, shuffle_buffer=128, seed=7)
    first, second = rows(r).dense[:, 0], rows(r).dense[:, 0]
    assert sorted(first) == sorted(second) == df["id"].tolist()
    assert first.tolist() != df["id"].tolist() and first.tolist() != second.tolist()
    again = TabularReader([d / "d.csv"], s, 50, shuffle=True, shuffle_buffer=128, seed=7)
    assert rows(again).dense[:, 0].tolist() == first.tolist()
    # the buffer bounds how far a row moves: none crosses a 128-row block
    assert all(set(first[i:i + 128]) == set(range(i, min(i + 128, 300))) for i in (0, 128))


def test_drop_last_and_restore(files):
    df, d = files
    s = fit_schema(schema(), [d / "d.csv"])
    assert [len(b) for b in TabularReader([d / "d.csv"], s, 128)] == [128, 128, 44]
    assert [len(b) for b in TabularReader([d / "d.csv"], s, 128, drop_last=True)] == [128, 128]
    r = TabularReader([d / "d.csv"], s, 100)
    it = iter(r)
    next(it)
    state = r.state()
    resumed = TabularReader([d / "d.csv"], s, 100)
    resumed.restore(state)
    same(rows(resumed), rows(TabularReader([d / "d.csv"], s, 100)).take(100, 300))


def test_bad_lines_name_file_and_line_and_can_be_skipped(tmp_path):
    lines = ["id,x,cat,y", "1,0.5,u,1", "2,oops,v,0", "3,0.1,w", "4,0.2,u,7", "5,0.3,v,1"]
    (tmp_path / "b.csv").write_text("\n".join(lines) + "\n")
    s = Schema(Label("y"), [Column("id"), Column("x"), Column("cat", "categorical")])
    with pytest.raises(DataFormatError, match=r"b\.csv:3: column 'x' is not a number: 'oops'"):
        list(TabularReader([tmp_path / "b.csv"], s, 10))
    r = TabularReader([tmp_path / "b.csv"], s, 10, skip_bad_lines=True)
    got = rows(r)
    assert got.dense[:, 0].tolist() == [1, 5] and r.bad_lines == 3
    assert any("b.csv:4: expected 4 columns" in e for e in r.bad_line_examples)
    assert any("b.csv:5: " in e for e in r.bad_line_examples)   # label 7
    with pytest.raises(DataFormatError, match="no column 'zz'"):
        list(TabularReader([tmp_path / "b.csv"], Schema(Label("zz"), [Column("x")]), 10))
    with pytest.raises(ConfigError, match="shard"):
        TabularReader([tmp_path / "b.csv"], s, 10, shard=(2, 2))


def test_equal_steps_refills_a_shard_left_short_by_skipped_bad_lines(tmp_path, caplog):
    rows = ["id,x,cat,y"] + [f"{i},{i / 10},u,{i % 2}" for i in range(40)]
    rows[1 + 2] = "2,broken,u,0"          # record 2: shard 0 of 2 loses one row
    (tmp_path / "s.csv").write_text("\n".join(rows) + "\n")
    s = Schema(Label("y"), [Column("id"), Column("x"), Column("cat", "categorical")])
    short = TabularReader([tmp_path / "s.csv"], s, 4, shard=(0, 2), equal_steps=True, skip_bad_lines=True)
    full = TabularReader([tmp_path / "s.csv"], s, 4, shard=(1, 2), equal_steps=True, skip_bad_lines=True)
    got = list(short)
    assert len(got) == len(list(full)) == len(short) == 5 and all(len(b) == 4 for b in got)
    ids = rows_of = np.concatenate([b.dense[:, 0] for b in got])
    assert ids[:19].tolist() == [i for i in range(0, 40, 2) if i != 2]    # its 19 good rows, then
    assert rows_of[19] == 0                                               # its first row again
    assert short.bad_lines >= 1 and full.bad_lines == 0


def test_batches_with_bags_cut_and_join_consistently():
    from hypothesis import given, settings, strategies as st

    @settings(max_examples=30, deadline=None)
    @given(st.lists(st.lists(st.lists(st.integers(-5, 5), min_size=1, max_size=3), min_size=2, max_size=2),
                    min_size=1, max_size=12), st.data())
    def check(rows, data):
        n = len(rows)
        fields = [[np.array(r[f], np.int64) for r in rows] for f in range(2)]
        b = TabularBatch.from_bags(np.arange(n, dtype=np.float32), np.zeros((n, 0), np.float32), fields)
        cut = data.draw(st.integers(0, n))
        joined = TabularBatch.concat([b.take(0, cut), b.take(cut, n)])
        for name in ("labels", "ids", "offsets", "weights"):
            np.testing.assert_array_equal(getattr(joined, name), getattr(b, name))
        order = np.array(data.draw(st.permutations(range(n))))
        picked = b.select(order)
        ends = np.r_[picked.offsets[1:], len(picked.ids)]
        for new, old in enumerate(order):
            for f in range(2):
                bag = picked.ids[picked.offsets[2 * new + f]:ends[2 * new + f]]
                assert bag.tolist() == rows[old][f]
    check()


def test_libsvm_preset_gives_each_row_one_bag_weighted_by_its_values(tmp_path):
    from paramshard.data import LibsvmReader, libsvm_schema
    lines = ["1 3:0.5 7:2", "-1 3:1", "0 9:1.5 2:1 4:0.25", "+1"]          # the last row has no feature
    (tmp_path / "d.svm").write_text("\n".join(lines) + "\n")
    b = rows(TabularReader([tmp_path / "d.svm"], libsvm_schema(), 3))
    ref = LibsvmReader([tmp_path / "d.svm"], 10, format="libsvm")
    (sb,) = list(ref)
    assert b.labels.tolist() == [1, 0, 0, 1] and b.num_fields == 1 and b.dense.shape == (4, 0)
    assert b.ids.tolist() == sb.ids.astype(np.int64).tolist() == [3, 7, 3, 9, 2, 4]
    assert b.offsets.tolist() == [0, 2, 3, 6] and b.weights.tolist() == [0.5, 2, 1, 1.5, 1, 0.25]
    odd = rows(TabularReader([tmp_path / "d.svm"], libsvm_schema(), 3, shard=(1, 2)))
    assert odd.labels.tolist() == [0, 1] and odd.ids.tolist() == [3]
    (tmp_path / "bad.svm").write_text("1 3:0.5\nnot a line\n")
    with pytest.raises(DataFormatError, match=r"bad\.svm:2"):
        list(TabularReader([tmp_path / "bad.svm"], libsvm_schema(), 3))
    r = TabularReader([tmp_path / "bad.svm"], libsvm_schema(), 3, skip_bad_lines=True)
    assert len(rows(r)) == 1 and r.bad_lines == 1


def test_files_without_rows_are_named_not_blamed_on_the_batch_size(tmp_path):
    """Issue 23: an empty --train was told to "use a smaller --batch-size"."""
    fitted = fit_schema(schema(), [_write(tmp_path / "d.csv", frame())])
    for name, text in (("empty.csv", ""), ("header.csv", "id,x,cat,y\n")):
        (tmp_path / name).write_text(text)
        with pytest.raises(ConfigError, match=f"{name}: no data rows \\(an empty file, or a header only\\)") as err:
            TabularReader([tmp_path / name], fitted, 8, equal_steps=True)
        assert "batch-size" not in str(err.value)
    with pytest.raises(ConfigError, match="make no full batch of 512: use a smaller --batch-size"):
        TabularReader([tmp_path / "d.csv"], fitted, 512, equal_steps=True)
    with pytest.raises(ConfigError, match=r"schema fit: no data rows in .*header.csv \(an empty file, or a header"):
        fit_schema(schema(), [tmp_path / "header.csv"])


def _write(path, df):
    df.to_csv(path, index=False)
    return path


def test_an_encoder_without_labels_gives_the_same_features_and_the_reader_still_needs_its_label(files):
    """Data to score (`paramshard predict`) has no label column: Encoder(labels=False) reads the
    features alone; the training reader keeps refusing a file without its label."""
    from paramshard.data.features.encode import Encoder
    df, d = files
    s = fit_schema(schema(), [d / "d.csv"])
    columns = {name: df[name].astype(str).to_numpy(object) for name in ("id", "x", "cat")}
    with_label, _ = Encoder(s).encode({**columns, "y": df["y"].astype(str).to_numpy(object)})
    without, bad = Encoder(s, labels=False).encode(columns)
    assert bad == [] and np.isnan(without.labels).all() and len(without) == len(df)
    np.testing.assert_array_equal(without.dense, with_label.dense)
    np.testing.assert_array_equal(without.ids, with_label.ids)
    df.drop(columns=["y"]).to_csv(d / "nolabel.csv", index=False)
    with pytest.raises(DataFormatError, match="no column 'y'"):
        rows(TabularReader([d / "nolabel.csv"], s, 64))
