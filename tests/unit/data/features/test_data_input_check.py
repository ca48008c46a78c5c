"""data/features/input_check.py: a job's files checked from their head before training, each failure naming
the flag, the file and the real problem."""
import gzip

import numpy as np
import pandas as pd
import pytest

from paramshard.data.readers import _reader
from paramshard.data.features.input_check import HEAD_BYTES, check_inputs
from paramshard.specs.schema import Column, Format, Label, Schema
from paramshard.errors import ConfigError


def schema(**fmt) -> Schema:
    return Schema(Label("click"), [Column("user_id", "categorical"), Column("movie_id", "categorical"),
                                   Column("age", transforms=["standardize"]), Column("note", "drop")],
                  format=Format(**fmt))


def table(n=50) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame({"user_id": rng.integers(1, 100, n), "movie_id": rng.integers(1, 100, n),
                         "age": rng.integers(18, 80, n), "click": rng.integers(0, 2, n)})


@pytest.fixture
def data(tmp_path):
    table().to_csv(tmp_path / "train.csv", index=False)
    return tmp_path


def test_good_files_pass_and_give_their_rows(data):
    assert check_inputs([data / "train.csv"], schema(), "train") >= 1
    assert check_inputs(data / "train.csv", schema(), "test", min_rows=50) == 50
    table(70).to_parquet(data / "t.parquet")
    table(30).to_csv(data / "t.tsv.gz", sep="\t", index=False, compression="gzip")
    assert check_inputs([data / "t.parquet"], schema(), "test") == 70          # Parquet: its metadata, exact
    assert check_inputs([data / "t.tsv.gz", data / "train.csv"], schema(), "train", min_rows=80) == 80


def test_a_missing_file_names_the_flag_and_the_nearest_file(data):
    with pytest.raises(ConfigError, match=r"--test .*/tarin.csv: no such file \(did you mean 'train.csv'\?\)"):
        check_inputs([data / "tarin.csv"], schema(), "test")
    with pytest.raises(ConfigError, match="--train .*: is a directory"):
        check_inputs([data], schema(), "train")
    with pytest.raises(ConfigError, match="--train: no input files given"):
        check_inputs([], schema(), "train")


def test_empty_files(data):
    (data / "e.csv").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"--test .*e.csv: empty file \(0 bytes\)"):
        check_inputs([data / "train.csv", data / "e.csv"], schema(), "test")
    (data / "e.csv.gz").write_bytes(gzip.compress(b""))
    with pytest.raises(ConfigError, match="empty file \\(no lines after decompression\\)"):
        check_inputs([data / "e.csv.gz"], schema(), "train")
    (data / "e.parquet").write_bytes(b"")
    with pytest.raises(ConfigError, match="e.parquet: empty file"):
        check_inputs([data / "e.parquet"], schema(), "train")


def test_a_header_without_rows_is_named_not_a_batch_size_problem(data):
    (data / "h.csv").write_text("user_id,movie_id,age,click\n\n\n")
    with pytest.raises(ConfigError, match=r"--train .*h.csv has a header \(user_id, movie_id, age, click\) but no "
                                          r"data rows"):
        check_inputs([data / "h.csv"], schema(), "train")
    table(0).to_parquet(data / "h.parquet")
    with pytest.raises(ConfigError, match="h.parquet: a Parquet file with columns .* but no rows"):
        check_inputs([data / "h.parquet"], schema(), "test")
    (data / "blank.csv").write_text("\nuser_id,movie_id,age,click\n1,2,3,0\n")
    with pytest.raises(ConfigError, match="first line, which the schema says is the header, is blank"):
        check_inputs([data / "blank.csv"], schema(), "test")


def test_missing_columns_get_did_you_mean(data):
    table().rename(columns={"movie_id": "movieId", "click": "clicked"}).to_csv(data / "x.csv", index=False)
    with pytest.raises(ConfigError, match=r"--test .*x.csv: no label column 'click' \(did you mean 'clicked'\?\)"):
        check_inputs([data / "x.csv"], schema(), "test")
    with pytest.raises(ConfigError, match=r"lacks the schema's column\(s\) 'movie_id' \(did you mean 'movieId'\?\); "
                                          r"the file has user_id, movieId, age, clicked"):
        check_inputs([data / "x.csv"], schema(), "predict")        # no label needed to predict
    table().drop(columns=["age"]).to_csv(data / "y.csv", index=False)
    with pytest.raises(ConfigError, match=r"column\(s\) 'age'; the file has"):       # no near name: no guess
        check_inputs([data / "y.csv"], schema(), "train")


def test_a_dropped_column_may_be_absent_and_headerless_files_use_format_names(data):
    table().to_csv(data / "n.csv", index=False, header=False)
    names = ["user_id", "movie_id", "age", "click"]
    assert check_inputs([data / "n.csv"], schema(header=False, names=names), "train") >= 1
    with pytest.raises(ConfigError, match="lists no column names"):
        check_inputs([data / "n.csv"], schema(header=False), "train")


def test_a_wrong_delimiter_is_pointed_at(data):
    table().to_csv(data / "semi.txt", sep=";", index=False)
    with pytest.raises(ConfigError, match="separated by ';', not ','"):
        check_inputs([data / "semi.txt"], schema(), "train")


def test_too_few_rows_overall(data):
    with pytest.raises(ConfigError, match=r"--train: 50 data rows in .*train.csv, fewer than the 512 needed "
                                          r"\(every trainer needs one full batch"):
        check_inputs([data / "train.csv"], schema(), "train", min_rows=512)


def test_only_the_head_of_a_big_text_file_is_read(data, monkeypatch):
    """Oracle: the bytes read, counted at the one place files are read."""
    big = pd.concat([table()] * 4000)            # 200k rows, ~3 MB
    big.to_csv(data / "big.csv", index=False)
    read = []
    real = _reader.read_blocks
    monkeypatch.setattr(_reader, "read_blocks", lambda path, n: (read.append(len(b)) or b for b in real(path, n)))
    rows = check_inputs([data / "big.csv"], schema(), "train", min_rows=10)
    assert 10 <= rows < len(big) and 0 < sum(read) <= HEAD_BYTES < (data / "big.csv").stat().st_size / 10
