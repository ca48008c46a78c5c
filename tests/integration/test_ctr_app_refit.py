"""The CTR app's refit on a small table, in one process (issue 32; apps/ctr/refit.py).

The oracle: the same seed and schedule give the same model. After selection picks the best
epoch E (decaying the rates after some epochs D before it), the refit is a fresh model trained
on all of --train for E epochs with the decays after D: exactly what an independent run with
``--valid-fraction 0 --epochs E --lr-decay-at D`` trains. Its test figures are the run's and
its model is the one --export writes: both equal the independent run's."""
import json

import numpy as np
import pandas as pd
import pytest

from paramshard.apps import ctr
from paramshard.inference.scoring import predict_files
from paramshard.specs.schema import Column, Label, Schema

from tests.integration.test_models_training import local_server  # noqa: F401  (the fixture)

# lr 0.03 with a decay after every epoch without a gain and no early stop: on this table and
# seed the selection run decays after epoch 2, is best at epoch 5, and decays again after 6.
FLAGS = ["--model", "lr", "--batch-size", "64", "--lr", "0.03", "--table-lr", "0.03", "--seed", "0"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("refit")
    rng = np.random.default_rng(5)
    for name, n in (("train", 1600), ("test", 500)):
        c, x = rng.integers(0, 40, n), rng.normal(size=n)
        y = (rng.random(n) < 1 / (1 + np.exp(-(x + (c % 5 - 2) * 0.6)))).astype(int)
        pd.DataFrame({"c": [f"v{v}" for v in c], "x": x.round(4), "y": y}).to_csv(d / f"{name}.csv", index=False)
    Schema(Label("y"), [Column("c", "categorical"), Column("x", transforms=["standardize"])]).save(d / "schema.json")
    return d


def run_app(d, out_dir, *extra) -> dict:
    out_dir.mkdir(exist_ok=True)
    assert ctr.main(["--train", str(d / "train.csv"), "--test", str(d / "test.csv"), "--schema", str(d / "schema.json"),
                     *FLAGS, "--json", str(out_dir / "out.json"), "--export", str(out_dir / "model.pt"), *extra]) == 0
    return json.loads((out_dir / "out.json").read_text())


def scores(model_path, data_path, out) -> np.ndarray:
    predict_files(model_path, [data_path], out=out)
    return pd.read_csv(out)["score"].to_numpy()


def test_the_refit_model_is_the_fixed_epoch_run_on_all_rows_with_the_same_decays(local_server, data, tmp_path,  # noqa: F811
                                                                                capsys):
    # --valid-fraction given: one hold-out (400 rows) as asked, not several (the next test).
    result = run_app(data, tmp_path / "auto", "--epochs", "6", "--patience", "0", "--lr-decay-after", "1",
                     "--valid-fraction", "0.25")
    said = capsys.readouterr().out
    # 1,600 rows, --refit left out (auto): planned and said at the start, recorded in the settings.
    assert "refit: after selection, a fresh model trains on all 1,600 rows" in said
    assert result["settings"]["refit"] == "auto" and result["settings"]["refit_planned"] is True
    assert result["settings"]["holdouts"] == 1
    best, decays = result["best_epoch"], result["lr_decays"]
    before = [e for e in decays if e < best]
    assert before, f"the selection run decayed after {decays}, none before its best epoch {best}: no schedule shown"
    refit = result["refit"]
    assert (refit["epochs"], refit["lr_decays"]) == (best, before) and len(refit["history"]) == best
    assert result["final_model"] == "refit" and result["final"] == refit["final"]
    assert result["final"]["rows"] == 500 and result["final"] != result["best"]        # another model than best's

    flags = refit["flags"].split()
    assert flags == ["--valid-fraction", "0", "--epochs", str(best), "--lr-decay-at", ",".join(map(str, before))]
    oracle = run_app(data, tmp_path / "oracle", *flags)
    assert oracle["final_model"] == "best epoch" and oracle["settings"]["refit_planned"] is False
    assert oracle["lr_decays"] == before and oracle["best_epoch"] == best
    assert oracle["final"] == result["final"]             # the same figures, exactly
    # --export wrote the refit's model: it scores every test row as the oracle's model does.
    ours = scores(tmp_path / "auto" / "model.pt", data / "test.csv", tmp_path / "ours.csv")
    theirs = scores(tmp_path / "oracle" / "model.pt", data / "test.csv", tmp_path / "theirs.csv")
    np.testing.assert_array_equal(ours, theirs)


def test_refit_never_keeps_the_best_epochs_model(local_server, data, tmp_path, capsys):  # noqa: F811
    result = run_app(data, tmp_path / "never", "--epochs", "2", "--refit", "never")
    assert "refit:" not in capsys.readouterr().out and "refit" not in result
    assert result["final_model"] == "best epoch" and result["final"] == result["best"]
    assert result["settings"]["refit"] == "never" and result["settings"]["refit_planned"] is False


def test_a_tiny_table_picks_the_epoch_count_on_several_hold_outs_then_refits(local_server, data, tmp_path,  # noqa: F811
                                                                            capsys):
    """1,600 rows: a quarter held out is 400 rows, fewer than the 1,000 a hold-out should have,
    so three hold-outs (1,200 rows) are trained without decays, the epoch count is the one whose
    mean validation AUC is best, and the refit trains for it: the oracle run again."""
    result = run_app(data, tmp_path / "three", "--epochs", "5")
    said = capsys.readouterr().out
    assert "refit: 3 hold-outs of 400 rows each" in said and "hold-out 3/3: epoch 5" in said
    held = result["holdouts"]
    assert held["count"] == 3 == result["settings"]["holdouts"] and result["settings"]["lr_decay"] == 1
    curves = [[e["valid"]["auc"] for e in result["epochs"]]]
    assert len(held["best_epochs"]) == 3 and len(held["mean_valid"]) == 5
    assert held["mean_valid"][0] != curves[0][0]          # the mean of three hold-outs, not the first's
    best = held["epochs"]
    assert held["mean_valid"][best - 1] == max(held["mean_valid"])
    assert result["refit"]["epochs"] == best and result["refit"]["lr_decays"] == [] and result["lr_decays"] == []
    flags = result["refit"]["flags"].split()
    assert flags == ["--valid-fraction", "0", "--epochs", str(best), "--lr-decay", "1"]
    oracle = run_app(data, tmp_path / "oracle", *flags)
    assert oracle["final"] == result["final"] and result["final_model"] == "refit"


def test_the_refit_in_one_process_of_collective_mode(local_server, data, tmp_path, monkeypatch):  # noqa: F811
    """PARAMSHARD_MODE=collective with no launcher: one trainer with hashed tables of its own;
    the refit is a second such job in the same process, again the oracle run's model."""
    monkeypatch.setenv("PARAMSHARD_MODE", "collective")
    result = run_app(data, tmp_path / "collective", "--epochs", "3", "--valid-fraction", "0.25")
    assert result["mode"] == "collective" and result["servers"] == 0 and result["final_model"] == "refit"
    oracle = run_app(data, tmp_path / "oracle", *result["refit"]["flags"].split())
    assert oracle["mode"] == "collective" and oracle["final"] == result["final"]
