"""Labels beyond binary, end to end: `schema infer` -> the CTR app in one process (its standalone
server) -> `paramshard predict` and the TorchScript export (issue 32).

- regression: a real-valued label is inferred as one; the app reaches a test RMSE well below the
  label's std, picks epochs by validation RMSE, and its MSE / RMSE / MAE equal scikit-learn's on
  the exported model's predictions (`paramshard predict` writes the value, not a probability);
- multi-task: two binary labels (click, buy) train one head each; the run's per-label AUC and log
  loss equal scikit-learn's on predict's score_click / score_buy columns;
- both: the TorchScript export scores as predict does ([B] values, [B, T] probabilities), and the
  report's result lines say the figures of the label's kind."""
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import log_loss, mean_absolute_error, mean_squared_error, roc_auc_score

from paramshard.apps import ctr
from paramshard.apps.ctr.result import result_record
from paramshard.data.features.infer import infer_schema
from paramshard.inference.portable import export_portable
from paramshard.inference.scoring import predict_files
from paramshard.observe.report.run_result import _describe

from tests.integration.test_models_training import local_server  # noqa: F401  (the fixture)

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")


def table(d, kind, rows=(3000, 800)):
    rng = np.random.default_rng(5)
    effect = rng.normal(0, 8, 12)
    for name, n in zip(("train", "test"), rows):
        x, z, c = rng.normal(size=n), rng.normal(size=n), rng.integers(0, 12, n)
        frame = {"x": x.round(4), "z": z.round(4), "shop": [f"s{k}" for k in c]}
        if kind == "regression":        # a price: std about 15, noise std 1
            frame["price"] = (50 + 10 * x - 5 * z + effect[c] + rng.normal(size=n)).round(3)
        else:                            # a click, and a purchase that follows clicks more often
            click = rng.random(n) < 1 / (1 + np.exp(-(x + effect[c] / 8)))
            buy = rng.random(n) < 1 / (1 + np.exp(-(2 * z - 1 + 1.5 * click)))
            frame["click"], frame["buy"] = click.astype(int), np.where(buy, "yes", "no")
        pd.DataFrame(frame).to_csv(d / f"{name}.csv", index=False)


def run_app(d, out_dir, *extra) -> dict:
    out = out_dir / "out.json"
    assert ctr.main(["--train", str(d / "train.csv"), "--test", str(d / "test.csv"), "--schema", str(d / "schema.json"),
                     "--epochs", "6", "--batch-size", "64", "--json", str(out), "--export", str(out_dir / "model.pt"),
                     *extra]) == 0
    return json.loads(out.read_text())


def torchscript_scores(model_path, data_path, tmp_path) -> np.ndarray:
    """The exported TorchScript module's output on the file's rows, encoded as predict encodes them."""
    from paramshard.inference.scoring import batches, schema_of
    from paramshard.inference.serving import build_from_file
    about = export_portable(model_path, tmp_path / "model.ts", "torchscript")
    module = torch.jit.load(str(tmp_path / "model.ts"))
    schema = schema_of(build_from_file(model_path), model_path)
    out = []
    for b, _ in batches([data_path], schema, True, 8192):
        t = b.torch()
        out.append(module(t["dense"], t["ids"]).numpy())
    return np.concatenate(out), about


def test_a_regression_trains_to_an_rmse_well_below_the_labels_std_and_equals_sklearn(local_server, tmp_path,  # noqa: F811
                                                                                     capsys):
    table(tmp_path, "regression")
    schema = infer_schema(tmp_path / "train.csv", label="price")
    assert schema.label_kind == "regression"
    schema.save(tmp_path / "schema.json")
    result = run_app(tmp_path, tmp_path, "--model", "widedeep", "--dim", "4", "--hidden", "16")
    said = capsys.readouterr().out
    assert "monitor rmse" in said and "valid RMSE" in said and "AUC" not in said and result["warnings"] == []
    test = pd.read_csv(tmp_path / "test.csv")
    y = test["price"].to_numpy()
    final = result["final"]
    assert final["rmse"] < 0.25 * y.std(), (final["rmse"], y.std())       # noise std 1, label std about 15
    summary = predict_files(tmp_path / "model.pt", [tmp_path / "test.csv"], out=tmp_path / "scores.csv")
    scores = pd.read_csv(tmp_path / "scores.csv")
    p = scores["score"].to_numpy()
    assert np.array_equal(scores["label"].to_numpy(), y)               # the label as it is, not 0/1
    assert final["mse"] == pytest.approx(mean_squared_error(y, p), rel=1e-6)
    assert final["rmse"] == pytest.approx(math.sqrt(mean_squared_error(y, p)), rel=1e-6)
    assert final["mae"] == pytest.approx(mean_absolute_error(y, p), rel=1e-6)
    assert summary["mse"] == pytest.approx(final["mse"], rel=1e-6) and p.min() < 30 < 70 < p.max()   # no sigmoid
    # Epochs picked by the lowest validation RMSE.
    valid = {e["epoch"]: e["valid"]["rmse"] for e in result["epochs"]}
    assert result["best_epoch"] == min(valid, key=valid.get)
    traced, about = torchscript_scores(tmp_path / "model.pt", tmp_path / "test.csv", tmp_path)
    assert about["outputs"][0]["shape"] == ["B"] and traced.shape == p.shape
    assert np.abs(traced - p).max() < 1e-3                             # float32 values near 50
    lines = _describe(result_record(result))
    assert "RMSE" in lines[1] and "MAE" in lines[2] and "AUC" not in " ".join(lines)


def test_multitask_labels_get_one_head_each_and_per_label_metrics_equal_sklearn(local_server, tmp_path,  # noqa: F811
                                                                                capsys):
    table(tmp_path, "multitask")
    schema = infer_schema(tmp_path / "train.csv", label="click,buy")
    assert schema.label_kind == "multitask" and schema.tasks[1].positive == ["yes"]
    schema.save(tmp_path / "schema.json")
    result = run_app(tmp_path, tmp_path, "--model", "deepfm", "--dim", "4", "--hidden", "16", "--epochs", "3")
    said = capsys.readouterr().out
    assert "mean AUC" in said and "click AUC" in said and "buy AUC" in said
    predict_files(tmp_path / "model.pt", [tmp_path / "test.csv"], out=tmp_path / "scores.csv")
    scores = pd.read_csv(tmp_path / "scores.csv")
    assert list(scores.columns) == ["score_click", "score_buy", "label_click", "label_buy"]
    test = pd.read_csv(tmp_path / "test.csv")
    truth = {"click": test["click"].to_numpy(), "buy": (test["buy"] == "yes").to_numpy().astype(int)}
    final = result["final"]
    for name, y in truth.items():
        p = scores[f"score_{name}"].to_numpy()
        assert np.array_equal(scores[f"label_{name}"].to_numpy(), y)
        assert final["tasks"][name]["auc"] == pytest.approx(roc_auc_score(y, p), abs=1e-6)
        assert final["tasks"][name]["logloss"] == pytest.approx(log_loss(y, p), rel=1e-5)
        assert final["tasks"][name]["auc"] > 0.7, (name, final["tasks"][name]["auc"])    # each head learnt its label
    assert final["auc"] == pytest.approx(np.mean([final["tasks"][n]["auc"] for n in truth]), abs=1e-12)
    traced, about = torchscript_scores(tmp_path / "model.pt", tmp_path / "test.csv", tmp_path)
    assert about["outputs"][0]["shape"] == ["B", 2] and about["outputs"][0]["labels"] == ["click", "buy"]
    assert np.abs(traced - scores[["score_click", "score_buy"]].to_numpy()).max() < 1e-5
    lines = _describe(result_record(result))
    assert "click AUC" in lines[2] and "buy AUC" in lines[2]
