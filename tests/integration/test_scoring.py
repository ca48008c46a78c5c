"""predict_files (`paramshard predict`): scores from a model file and data files, no code.
Oracle: the trained model's own forward through the server, on the same rows in the same
batches (tiny_ctr.Job.expected); AUC and log loss are paramshard.inference.evaluation's over them."""
import io

import numpy as np
import pandas as pd
import pytest
import torch

from paramshard.data.errors import DataFormatError
from paramshard.data.metrics import auc, logloss
from paramshard.errors import ConfigError
from paramshard.inference.scoring import predict_files
from paramshard.inference.serving import ModelFileError, export_model
from tests.integration.tiny_ctr import SCORE_BATCH, Job


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    job = Job(tmp_path_factory.mktemp("scoring"))
    export_model(job.ckpt, job.root / "model.pt")
    return job


def test_scores_are_the_trained_models_and_labels_give_auc_and_logloss(job, tmp_path):
    result = predict_files(job.root / "model.pt", [job.root / "test.csv"], tmp_path / "s.csv", SCORE_BATCH)
    got = pd.read_csv(tmp_path / "s.csv")
    assert list(got.columns) == ["score", "label"]
    np.testing.assert_array_equal(got["score"].to_numpy(), job.expected)       # exactly: the same numbers
    np.testing.assert_array_equal(got["label"].to_numpy(), job.test["click"].to_numpy())
    assert result["rows"] == len(job.test) and result["labels"]
    assert result["auc"] == pytest.approx(auc(job.test["click"], job.expected), abs=1e-12)
    assert result["logloss"] == pytest.approx(logloss(job.test["click"], job.expected), abs=1e-12)


@pytest.mark.parametrize("data", ["new.csv", "new.parquet"])
def test_data_without_the_label_column_is_scored_row_for_row(job, tmp_path, data):
    result = predict_files(job.root / "model.pt", [job.root / data], tmp_path / "s.parquet", SCORE_BATCH)
    got = pd.read_parquet(tmp_path / "s.parquet")
    assert list(got.columns) == ["score"] and result == {"rows": len(job.test), "labels": False}
    np.testing.assert_array_equal(got["score"].to_numpy(), job.expected)


def test_several_files_are_scored_in_order_to_stdout(job):
    out = io.StringIO()
    predict_files(job.root / "model.pt", [job.root / "new.csv", job.root / "new.parquet"], None, SCORE_BATCH,
                  stream=out)
    got = pd.read_csv(io.StringIO(out.getvalue()))
    np.testing.assert_array_equal(got["score"].to_numpy(), np.concatenate([job.expected, job.expected]))


def test_another_batch_size_changes_only_the_last_bits(job, tmp_path):
    # A matrix product's sums group differently in other batch sizes (BLAS): not the same bits.
    predict_files(job.root / "model.pt", [job.root / "new.csv"], tmp_path / "s.tsv", batch_size=5)
    np.testing.assert_allclose(pd.read_csv(tmp_path / "s.tsv", sep="\t")["score"], job.expected, rtol=1e-6)


def test_files_that_cannot_be_scored_are_named(job, tmp_path):
    model = job.root / "model.pt"
    with pytest.raises(ConfigError, match="new.csv has no label column 'click' and .*test.csv has one"):
        predict_files(model, [job.root / "test.csv", job.root / "new.csv"], tmp_path / "s.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("price,city,tags\n3.5,paris,a\nlots,rome,b\n")
    with pytest.raises(DataFormatError, match=r"bad.csv:3: column 'price' is not a number.*predict scores every row"):
        predict_files(model, [bad], tmp_path / "s.csv")
    with pytest.raises(ConfigError, match=r"--out .*s.json: write .csv, .tsv, .parquet or .pq"):
        predict_files(model, [job.root / "new.csv"], tmp_path / "s.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv"]        # nothing half-written left


def test_a_model_file_without_a_recorded_model_says_to_pass_the_module(job, tmp_path):
    data = torch.load(job.root / "model.pt", weights_only=True)
    del data["spec"]                       # as a file of a model built by hand, or from before specs
    torch.save(data, tmp_path / "old.pt")
    with pytest.raises(ModelFileError, match="old.pt: this model file has no recorded model .*"
                                             r"pass the module, ps.load_model\(module, FILE\)"):
        predict_files(tmp_path / "old.pt", [job.root / "new.csv"], tmp_path / "s.csv")


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_kept_columns_are_copied_row_for_row_before_the_score(job, tmp_path, suffix):
    frame = pd.read_csv(job.root / "new.csv", dtype=str, keep_default_na=False)
    ids = [f"row-{i:04d}" for i in range(len(frame))][::-1]          # not the row order: copied, not made
    frame.insert(0, "id", ids)
    frame["shop"] = "s" + frame.index.astype(str)
    data = tmp_path / f"keyed{suffix}"
    frame.to_parquet(data, index=False) if suffix == ".parquet" else frame.to_csv(data, index=False)
    out = tmp_path / "s.csv"
    result = predict_files(job.root / "model.pt", [data, data], out, batch_size=7, keep=["id", "shop"])
    got = pd.read_csv(out, dtype={"id": str, "shop": str})
    assert list(got.columns) == ["id", "shop", "score"] and result["rows"] == 2 * len(frame)
    assert got["id"].tolist() == ids + ids and got["shop"].tolist() == 2 * frame["shop"].tolist()
    np.testing.assert_allclose(got["score"].to_numpy(), np.concatenate([job.expected, job.expected]), rtol=1e-6)


def test_a_kept_column_text_in_one_file_and_typed_in_another_takes_the_first_files_type(job, tmp_path):
    frame = pd.read_csv(job.root / "new.csv", dtype=str, keep_default_na=False)
    frame.insert(0, "id", range(len(frame)))
    frame.to_csv(tmp_path / "a.csv", index=False)
    frame.to_parquet(tmp_path / "b.parquet", index=False)           # id: int64 here, text in a.csv
    predict_files(job.root / "model.pt", [tmp_path / "a.csv", tmp_path / "b.parquet"], tmp_path / "s.parquet",
                  SCORE_BATCH, keep=["id"])
    got = pd.read_parquet(tmp_path / "s.parquet")
    assert got["id"].tolist() == 2 * [str(i) for i in range(len(frame))]
    np.testing.assert_array_equal(got["score"].to_numpy(), np.concatenate([job.expected, job.expected]))


def test_an_unknown_kept_column_names_the_columns_there_are_and_writes_nothing(job, tmp_path):
    with pytest.raises(ConfigError, match=r"--keep id: .*new.csv has no column 'id' \(its columns: price, city, tags\)"):
        predict_files(job.root / "model.pt", [job.root / "new.csv"], tmp_path / "s.csv", keep=["id"])
    with pytest.raises(ConfigError, match=r"--keep citty: .*new.csv has no column 'citty' \(did you mean 'city'\?\)"):
        predict_files(job.root / "model.pt", [job.root / "new.csv", job.root / "new.parquet"], None, keep=["citty"])
    with pytest.raises(ConfigError, match="--keep score: the scores file has a column 'score' of its own"):
        predict_files(job.root / "model.pt", [job.root / "new.csv"], tmp_path / "s.csv", keep=["score"])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("content", ["", "price,city,tags\n"])
def test_input_without_rows_is_an_error_not_zero_scores(job, tmp_path, content):
    empty = tmp_path / "empty.csv"
    empty.write_text(content)
    out = io.StringIO()
    with pytest.raises(ConfigError, match=r"no rows to score in .*empty.csv: the file is empty or hold"):
        predict_files(job.root / "model.pt", [empty], None, stream=out)
    assert out.getvalue() == ""
    with pytest.raises(ConfigError, match="no rows to score"):
        predict_files(job.root / "model.pt", [empty], tmp_path / "s.parquet")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.csv"]       # no scores file


def test_a_semicolon_file_is_scored_with_the_delimiter_flag(job, tmp_path):
    semi = tmp_path / "new.semi.csv"
    semi.write_text((job.root / "new.csv").read_text().replace(",", ";"))
    with pytest.raises(DataFormatError, match="looks separated by ';', not ',': pass --delimiter ';'"):
        predict_files(job.root / "model.pt", [semi], tmp_path / "s.csv", SCORE_BATCH)
    predict_files(job.root / "model.pt", [semi], tmp_path / "s.csv", SCORE_BATCH, delimiter=";")
    np.testing.assert_array_equal(pd.read_csv(tmp_path / "s.csv")["score"].to_numpy(), job.expected)
