"""The CTR app alone against the same app as a launched job (issue 23): is one process with its
in-process server at least as fast as one trainer of a cluster?

The user's commands, unchanged: UCI Adult (`paramshard dataset adult`), a schema inferred
(``--label income``) and fitted, then ``python -m paramshard.apps.ctr --train ... --test ...
--schema ... --epochs E --json OUT`` (DeepFM, batch 256 per trainer, sync) run

- ``standalone``: under plain python, no PARAMSHARD_* variable and no OMP_NUM_THREADS /
  MKL_NUM_THREADS (torch's threads are what ``ps.init()`` chooses);
- ``standalone (--before)``: the same from another tree's ``src`` (``--before DIR``), e.g. a
  worktree of the commit before a change;
- ``launch 1+1`` and ``launch 2+2``: under ``paramshard launch --servers S --trainers T``
  (the launcher gives every rank its OMP_NUM_THREADS share of the host).

samples/s is the app's own ``samples_per_s`` of the last epoch (rows of every trainer over the
epoch's seconds, evaluation excluded); "per trainer" divides it by the trainers. ``--rounds``
rounds run every candidate once, the order rotated each round; the table gives medians and
min-max. Each run is a fresh process tree with a deadline, torn down by PID (benchmarks/_common.py).

    .venv/bin/python benchmarks/ctr_app_standalone.py [--rounds 3] [--epochs 1] [--before /tmp/old/src] [--markdown]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
from ps_vs_pytorch import child_environ, paramshard_cli  # noqa: E402

SRC = Path(__file__).resolve().parent.parent / "src"


def prepare(workdir: Path) -> dict:
    """Adult's train/test CSV files and a fitted schema, as the README's commands make them."""
    from paramshard.data import fit_schema, infer_schema
    from paramshard.data.datasets import fetch
    train, test = fetch("adult", workdir / "adult")
    schema = fit_schema(infer_schema(train, label="income"), [train]).save(workdir / "adult.fitted.json")
    return {"train": train, "test": test, "schema": schema}


def candidates(before: str | None) -> dict[str, tuple[int, str, list[str] | None]]:
    """name -> (trainers, PYTHONPATH, the launcher's arguments or None for a plain process)."""
    out = {"standalone": (1, str(SRC), None)}
    if before:
        out["standalone (--before)"] = (1, before, None)
    for s, t in ((1, 1), (2, 2)):
        out[f"launch {s}+{t}"] = (t, str(SRC), ["--servers", str(s), "--trainers", str(t), "--timeout", "120"])
    return out


def run_environ(pythonpath: str) -> dict:
    """A user's shell as the candidates see it: no PARAMSHARD_* (standalone must find no cluster) and
    no thread variable (torch's threads are what ps.init() or the launcher choose: the measure)."""
    env = {k: v for k, v in child_environ().items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["PYTHONPATH"] = pythonpath
    return env


def run_one(children: C.Children, name: str, cand, data: dict, epochs: int, workdir: Path, timeout: float) -> dict:
    trainers, pythonpath, launch = cand
    run = workdir / f"run-{time.monotonic_ns()}"
    out = run / "result.json"
    app = ["-m", "paramshard.apps.ctr", "--train", str(data["train"]), "--test", str(data["test"]),
           "--schema", str(data["schema"]), "--epochs", str(epochs), "--json", str(out)]
    # The launcher's run directory goes with the rest, not into the working directory.
    argv = [sys.executable, *app] if launch is None else [*paramshard_cli(), "launch", *launch, "--run-dir",
                                                          str(run / "job"), *app]
    env = run_environ(pythonpath)
    load = os.getloadavg()[0]
    try:
        proc = children.spawn(name, argv, env)
        log = children.popen[-1][2]
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{name} did not finish within {timeout:g} s; its log:\n{C.tail(log, 40)}") from None
        if code != 0 or not out.exists():
            raise RuntimeError(f"{name} exited with code {code}; its log:\n{C.tail(log, 40)}")
    finally:
        children.stop_all()
    last = json.loads(out.read_text())["epochs"][-1]
    return {"samples_per_s": last["samples_per_s"], "per_trainer": last["samples_per_s"] / trainers,
            "auc": last["auc"], "load": load}


def report(runs: dict[str, list[dict]], markdown: bool, note: str) -> None:
    base = C.median(r["per_trainer"] for r in runs["standalone"])
    headers = ["candidate", "samples/s (median)", "min-max", "per trainer (median)",
               "standalone / this per trainer", "test AUC", "load avg at starts"]
    rows = []
    for name, rs in runs.items():
        rates = [r["samples_per_s"] for r in rs]
        per = C.median(r["per_trainer"] for r in rs)
        rows.append([name, f"{C.median(rates):,.0f}", f"{min(rates):,.0f}-{max(rates):,.0f}", f"{per:,.0f}",
                     f"{base / per:.2f}x", f"{rs[0]['auc']:.4f}", ", ".join(f"{r['load']:.1f}" for r in rs)])
    C.emit(markdown, [("The CTR app alone vs launched (Adult, DeepFM)", headers, rows,
                       [False, True, True, True, True, True, False])], [note])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--before", metavar="SRC", help="another tree's src directory: its standalone run too")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds each run may take")
    p.add_argument("--markdown", action="store_true", help="print markdown tables for RESULTS.md")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.epochs < 1:
        p.error("--rounds and --epochs must be >= 1")
    C.install_sigterm_as_exit()
    note = C.machine_note()
    cands = candidates(args.before)
    runs: dict[str, list[dict]] = {name: [] for name in cands}
    children = C.Children()
    with tempfile.TemporaryDirectory(prefix="bench-ctr-app-") as tmp:
        workdir = Path(tmp)
        data = prepare(workdir)
        names = list(cands)
        for rnd in range(args.rounds):
            for name in names[rnd % len(names):] + names[:rnd % len(names)]:
                r = run_one(children, name, cands[name], data, args.epochs, workdir, args.timeout)
                runs[name].append(r)
                print(f"round {rnd + 1}: {name}: {r['samples_per_s']:,.0f} samples/s (load {r['load']:.1f})",
                      flush=True)
    note += f"; {args.rounds} rounds, order rotated; {args.epochs} epoch(s) per run"
    report(runs, args.markdown, note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
