"""Do the CTR app's defaults hold on small tables too? (issue 32)

Per public table (``paramshard dataset NAME``, see paramshard.data.datasets) and model, for
seeds 0..S-1, two runs of the app in one process (``python -m paramshard.apps.ctr``: the
training loop is the question here, not the cluster):

- **defaults**: the flags a user gives (``--train --test --schema --model --seed``), the
  rest the app's: its own hold-out, early stopping, learning-rate decay, epoch cap and, on
  a small table, the refit on all of --train (apps/ctr/refit.py); the figure is the test
  AUC of the run's model (``"final"`` of ``--json``: the refit's, or the best epoch's);
- **fixed epochs**: no hold-out (``--valid-fraction 0``), no decay, no early stop, ``--epochs E``;
  ``--json`` records the test AUC after every epoch, so one run gives the whole curve.
  The best fixed-epoch run is the epoch count with the highest mean test AUC over the seeds
  (chosen on the test set: the oracle no user has, so the defaults are measured against an
  upper bound).

The table: mean and standard deviation over the seeds of the defaults' test AUC, the best
fixed epoch count and its mean AUC, and the gap (defaults - best fixed; goal: >= -0.003).
Runs are interleaved (seed by seed, defaults first on even seeds, fixed first on odd ones).

    .venv/bin/python benchmarks/app_defaults.py --markdown
    .venv/bin/python benchmarks/app_defaults.py --datasets oj --models lr --seeds 2 --epochs 3   # smoke
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
from paramshard.data.datasets import LABELS  # noqa: E402

GOAL = -0.003          # defaults minus the best fixed-epoch run, mean test AUC


def cli(*args, timeout: float = 900) -> str:
    r = subprocess.run([sys.executable, "-m", "paramshard", *args], capture_output=True, text=True, timeout=timeout)
    if r.returncode:
        raise RuntimeError(f"paramshard {' '.join(args)} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r.stdout


def prepare(name: str, root: Path) -> dict:
    raw = root / "raw" / name
    cli("dataset", name, str(raw))
    schema, fitted = root / f"{name}.schema.json", root / f"{name}.fitted.json"
    cli("schema", "infer", str(raw / "train.csv"), "--label", LABELS[name], "-o", str(schema))
    cli("schema", "fit", str(schema), str(raw / "train.csv"), "-o", str(fitted))
    return {"train": raw / "train.csv", "test": raw / "test.csv", "schema": fitted}


def run_app(files: dict, model: str, seed: int, out: Path, extra: list[str], timeout: float) -> dict:
    argv = [sys.executable, "-m", "paramshard.apps.ctr", "--train", str(files["train"]), "--test", str(files["test"]),
            "--schema", str(files["schema"]), "--model", model, "--seed", str(seed), "--json", str(out), *extra]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "PYTHONHASHSEED": "0"})
    if r.returncode:
        raise RuntimeError(f"{' '.join(argv[2:])} failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return json.loads(out.read_text())


def model_epochs(result: dict) -> int:
    """The epochs the run's model trained: the refit's (apps/ctr/refit.py) or the best epoch."""
    return result["refit"]["epochs"] if "refit" in result else result["best_epoch"]


def summarise(name: str, model: str, defaults: list[dict], fixed: list[dict]) -> list[str]:
    picked = [d["final"]["auc"] for d in defaults]      # the run's model: the refit's when it refits
    epochs_run = [len(d["epochs"]) for d in defaults]
    curves = [[e["auc"] for e in f["epochs"]] for f in fixed]
    means = [statistics.mean(c[i] for c in curves) for i in range(min(map(len, curves)))]
    best_i = max(range(len(means)), key=means.__getitem__)
    gap = statistics.mean(picked) - means[best_i]
    spread = statistics.stdev(picked) if len(picked) > 1 else 0.0
    return [name, model, f"{statistics.mean(picked):.4f} ± {spread:.4f}",
            f"{statistics.median(map(model_epochs, defaults)):g} of {statistics.median(epochs_run):g}"
            + (" (refit)" if all("refit" in d for d in defaults) else ""),
            f"{best_i + 1}", f"{means[best_i]:.4f}", f"{gap:+.4f}", "yes" if gap >= GOAL else "**no**"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--datasets", default="oj,caravan,womens_clothing,adult,movielens100k,bio_kdd04")
    p.add_argument("--models", default="deepfm")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=15, help="the fixed-epoch runs' length (the curve's)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    p.add_argument("--keep", metavar="DIR", help="keep the data and every run's --json here")
    p.add_argument("--reuse-fixed", metavar="DIR",
                   help="take the fixed-epoch runs' --json from DIR (an earlier --keep) when there: they set every "
                        "flag the defaults decide, so a change of the defaults leaves them alone")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    names = [n for n in args.datasets.split(",") if n]
    if unknown := [n for n in names if n not in LABELS]:
        p.error(f"unknown datasets {unknown}: choose from {', '.join(LABELS)}")
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="app-defaults-"))
    root.mkdir(parents=True, exist_ok=True)
    fixed_flags = ["--valid-fraction", "0", "--lr-decay", "1", "--patience", "0", "--epochs", str(args.epochs)]
    rows = []
    for name in names:
        files = prepare(name, root)
        for model in args.models.split(","):
            defaults, fixed = [], []
            for seed in range(args.seeds):
                order = [("defaults", []), ("fixed", fixed_flags)]
                for kind, flags in (order if seed % 2 == 0 else order[::-1]):
                    out = root / f"{name}-{model}-{kind}-{seed}.json"
                    earlier = Path(args.reuse_fixed or root) / out.name
                    if kind == "fixed" and args.reuse_fixed and earlier.exists():
                        result = json.loads(earlier.read_text())
                    else:
                        result = run_app(files, model, seed, out, flags, args.timeout)
                    (defaults if kind == "defaults" else fixed).append(result)
                print(f"  {name} {model} seed {seed}: defaults {defaults[-1]['final']['auc']:.4f} "
                      f"(epoch {model_epochs(defaults[-1])} of {len(defaults[-1]['epochs'])}"
                      f"{', refit' if 'refit' in defaults[-1] else ''}), fixed "
                      + " ".join(f"{e['auc']:.4f}" for e in fixed[-1]["epochs"]), file=sys.stderr, flush=True)
            rows.append(summarise(name, model, defaults, fixed))
    headers = ["table", "model", "defaults: test AUC (mean ± std)",
               "epochs of the run's model, of epochs run (median)",
               "best fixed epochs", "its test AUC (mean)", "gap", f"within {-GOAL:g}"]
    C.emit(args.markdown, [("the CTR app's defaults against the best fixed-epoch run", headers, rows,
                            [False, False, True, True, True, True, True, False])],
           [f"{args.seeds} seeds per table and model; one process per run (`python -m paramshard.apps.ctr`); "
            f"{C.machine_note()}"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
