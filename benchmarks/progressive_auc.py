"""Progressive AUC on a stream against the offline AUC after one pass over the same events.

The CTR demo's data (`paramshard gen-data`: synthetic Criteo rows from a hidden logistic model):
``--events`` rows to learn from and ``--test`` fresh rows of the same hidden model. Two runs of the
CTR app, one process each (its standalone server), same model, batch size and seed:

- stream: the events as one CSV file in a directory, `--stream DIR --max-events N --window W`: each
  batch scored by the model as it stands, then trained on; the progressive AUC over the last W
  events (and over all N, `--window N`, in a second stream run when ``--whole``);
- offline: `--train EVENTS --valid TEST --test TEST --epochs 1 --refit never`: one pass over the
  same events, then the final model's AUC on the fresh rows.

Prints both and their difference (the issue's goal: within 0.005 after one pass).

    PYTHONPATH=src python benchmarks/progressive_auc.py --events 200000 --window 50000
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


def run_app(work: Path, args: list[str], name: str) -> tuple[dict, float]:
    out = work / f"{name}.json"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "paramshard.apps.ctr", *args, "--json", str(out)], cwd=work,
                          capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"{name} run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text()), time.monotonic() - started


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--test", type=int, default=50_000)
    p.add_argument("--window", type=int, default=50_000)
    p.add_argument("--model", default="deepfm")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--seed", type=int, default=5, help="the data's and the runs' seed")
    p.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    args = p.parse_args()

    from paramshard.data.features.presets import criteo_schema
    from paramshard.data.synthetic import generate_criteo

    work = Path(args.dir or tempfile.mkdtemp(prefix="progressive-auc-"))
    work.mkdir(parents=True, exist_ok=True)
    schema = criteo_schema()
    schema.save(work / "schema.json")
    truth = generate_criteo(work / "all.tsv", args.events + args.test, seed=args.seed)
    lines = (work / "all.tsv").read_text().splitlines(keepends=True)
    (work / "events.tsv").write_text("".join(lines[:args.events]))
    (work / "test.tsv").write_text("".join(lines[args.events:]))
    live = work / "live"
    live.mkdir(exist_ok=True)
    with open(live / "events.csv", "w") as f:                 # the same events, as a stream's file
        f.write(",".join(schema.format.names) + "\n")
        f.writelines(line.replace("\t", ",") for line in lines[:args.events])
    common = ["--schema", str(work / "schema.json"), "--model", args.model, "--batch-size", str(args.batch_size),
              "--seed", str(args.seed)]
    stream, stream_s = run_app(work, ["--stream", str(live), "--max-events", str(args.events),
                                      "--window", str(args.window), *common], "stream")
    offline, offline_s = run_app(work, ["--train", str(work / "events.tsv"), "--valid", str(work / "test.tsv"),
                                        "--test", str(work / "test.tsv"), "--epochs", "1", "--refit", "never",
                                        *common], "offline")
    progressive = stream["progressive"]["auc"]
    offline_auc = offline["final"]["auc"]             # the test files, scored by the model after the pass
    print(f"{args.model} on {args.events:,} synthetic Criteo events (seed {args.seed}; the hidden model's own AUC "
          f"{truth.hidden_auc:.4f}), batch {args.batch_size}, one process each")
    print(f"  stream: progressive AUC over the last {args.window:,} events {progressive:.4f} "
          f"({stream['events']:,} events in {stream_s:.0f} s)")
    print(f"  offline: one pass, test AUC on {args.test:,} fresh rows {offline_auc:.4f} ({offline_s:.0f} s)")
    diff = progressive - offline_auc
    print(f"  difference {diff:+.4f}: {'within' if abs(diff) <= 0.005 else 'NOT within'} 0.005")


if __name__ == "__main__":
    main()
