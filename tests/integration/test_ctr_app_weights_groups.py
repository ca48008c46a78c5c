"""The CTR app in one process (its standalone server) on a small table (issue 32):
- ``--weight w --group-by user``: the run's test figures equal scikit-learn's weighted AUC and log
  loss and a per-user GAUC loop over the exported model's scores; the weight is no feature of the
  exported model (`paramshard predict` does not need it);
- the weights reach the loss: weighing every positive row 0 trains a model that scores every row
  low;
- the hold-out scales with the table: 1,000 of 2,400 rows asked, a quarter held out."""
import json

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import log_loss, roc_auc_score

from paramshard.apps import ctr
from paramshard.data.shards.holdout import Holdout
from paramshard.inference.scoring import predict_files
from paramshard.specs.schema import Column, Label, Schema

from tests.integration.test_models_training import local_server  # noqa: F401  (the fixture)
from tests.unit.data.test_data_weighted_metrics import gauc_by_loop

ROWS = 2400


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("weights")
    rng = np.random.default_rng(1)
    for name, n in (("train", ROWS), ("test", 600)):
        user = rng.integers(0, 30, n)
        x = rng.normal(size=n)
        y = (rng.random(n) < 1 / (1 + np.exp(-(x + (user % 3 - 1))))).astype(int)
        pd.DataFrame({"user": [f"u{u}" for u in user], "x": x.round(4), "w": rng.choice([0.5, 1.0, 3.0], n),
                      "w0": np.where(y == 1, 0.0, 1.0), "y": y}).to_csv(d / f"{name}.csv", index=False)
    Schema(Label("y"), [Column("user", "categorical"), Column("x", transforms=["standardize"]), Column("w"),
                        Column("w0", "drop")]).save(d / "schema.json")
    return d


def run_app(d, out_dir, *extra) -> dict:
    out = out_dir / "out.json"
    assert ctr.main(["--train", str(d / "train.csv"), "--test", str(d / "test.csv"), "--schema", str(d / "schema.json"),
                     "--model", "lr", "--epochs", "3", "--batch-size", "64", "--json", str(out),
                     "--export", str(out_dir / "model.pt"), *extra]) == 0
    return json.loads(out.read_text())


def scores(model_path, data_path, tmp_path) -> np.ndarray:
    """What `paramshard predict MODEL DATA` writes: one score per row, in order."""
    predict_files(model_path, [data_path], out=tmp_path / "scores.csv")
    return pd.read_csv(tmp_path / "scores.csv")["score"].to_numpy()


def test_weighted_metrics_and_gauc_equal_sklearn_on_the_exported_models_scores(local_server, data, tmp_path,  # noqa: F811
                                                                             capsys):
    result = run_app(data, tmp_path, "--weight", "w", "--group-by", "user")
    said = capsys.readouterr().out
    assert "a small table" in said and "GAUC" in said and "rows weighted by 'w'" in said
    test = pd.read_csv(data / "test.csv")
    # The weight is no feature: the exported model scores a file without it (nor w0, dropped).
    test.drop(columns=["w", "w0"]).to_csv(tmp_path / "unweighted.csv", index=False)
    p = scores(tmp_path / "model.pt", tmp_path / "unweighted.csv", tmp_path)
    y, w = test["y"].to_numpy(), test["w"].to_numpy()
    final = result["final"]
    assert final["auc"] == pytest.approx(roc_auc_score(y, p, sample_weight=w), abs=1e-6)
    assert final["logloss"] == pytest.approx(log_loss(y, p, sample_weight=w), rel=1e-5)
    assert final["gauc"] == pytest.approx(gauc_by_loop(test["user"].to_numpy(), y, p, w), abs=1e-6)
    assert final["groups"] == 30 and abs(final["auc"] - roc_auc_score(y, p)) > 1e-4     # weighted, not plain
    assert all("gauc" in e["valid"] and "gauc" in e for e in result["epochs"])
    # --valid-fraction left out: 1,000 of 2,400 rows asked, capped at a quarter.
    assert result["settings"]["valid_fraction"] == 0.25 and result["settings"]["patience"] == 4
    held = int(Holdout(0.25, seed=0, part="held").per_shard(ROWS)[0])
    assert result["epochs"][0]["valid"]["rows"] == held and 500 < held < 700


def test_the_weights_reach_the_loss(local_server, data, tmp_path):  # noqa: F811
    """Every positive row weighs 0: the model learns from negatives only and scores every row low."""
    run_app(data, tmp_path, "--weight", "w0", "--valid-fraction", "0")
    p = scores(tmp_path / "model.pt", data / "test.csv", tmp_path)
    assert p.mean() < 0.15, p.mean()        # the test rows' positive rate is about a half
