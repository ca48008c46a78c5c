"""Train a CTR model on any tabular file, no code: ``python -m paramshard.apps.ctr``.

    paramshard launch --servers 2 --trainers 2 -m paramshard.apps.ctr \\
        --train data/adult/train.csv --test data/adult/test.csv --schema adult.fitted.json \\
        --model deepfm --epochs 3 --json runs/adult.json
    python -m paramshard.apps.ctr ...        # the same in one process, no launcher

Every mode of the launcher works: in hybrid mode the tables stay on the
servers and the dense part is averaged by allreduce; in collective mode (no
servers) every trainer holds hashed tables of --buckets rows (models/hashed.py).

Every trainer reads its share of the rows of --train (rows t, t+T, ...),
shuffled each epoch, the same number of steps on every trainer. After each
epoch all trainers meet at a barrier, trainer 0 evaluates on --test (exact
AUC, log loss, accuracy), and all meet again before the next epoch, so the
evaluation sees exactly the model of the epoch's end, in async mode too.
A schema without statistics is fitted by every trainer over all of --train
(the same rows, so the same result everywhere); `paramshard schema fit`
once beforehand saves that pass.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import paramshard as ps
from ..data.fit import fit_schema
from ..data.schema import Schema
from ..data.batch import TabularBatch
from ..data.tabular import TabularReader
from ..errors import ConfigError, ParamshardError
from ..evaluation import evaluate
from ..models import MODELS, build_model, hashed_embedding
from ..observe.server_table import StepProgress


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m paramshard.apps.ctr", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--train", nargs="+", required=True, metavar="PATH", help="training files (CSV, TSV, Parquet)")
    p.add_argument("--test", nargs="+", required=True, metavar="PATH", help="test files, same columns")
    p.add_argument("--schema", required=True, metavar="FILE", help="from `paramshard schema infer` (and fit)")
    p.add_argument("--model", choices=sorted(MODELS), default="deepfm")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=256, help="rows per step per trainer")
    p.add_argument("--dim", type=int, default=8, help="embedding width")
    p.add_argument("--hidden", default="128,64", help="MLP widths, comma-separated")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate of the dense parameters")
    p.add_argument("--table-lr", type=float, default=0.05, help="Adagrad learning rate of the embedding rows")
    p.add_argument("--buckets", type=int, default=1 << 16,
                   help="collective mode only: rows of each hashed table every trainer holds (a power of two)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-bad-lines", action="store_true", help="count malformed lines instead of failing")
    p.add_argument("--json", metavar="OUT", help="write per-epoch and final test metrics here (trainer 0)")
    return p


def check(args) -> None:
    for name in ("epochs", "batch_size", "dim"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    try:
        args.hidden = tuple(int(h) for h in args.hidden.split(",") if h.strip())
    except ValueError:
        raise ConfigError(f"--hidden {args.hidden!r}: expected widths like 128,64") from None


def load_schema(path, train, skip_bad_lines: bool, log) -> Schema:
    schema = Schema.load(path)
    if schema.unfitted():
        log(f"schema {path} has no statistics for {', '.join(schema.unfitted())}: fitting it on the "
            f"training files (run `paramshard schema fit` once to skip this)")
        schema = fit_schema(schema, train, skip_bad_lines=skip_bad_lines)
    return schema


def capacity_hint(schema: Schema) -> int:
    """Distinct ids the fitted data had: the tables reserve that many rows up front."""
    total = 0
    for c in schema.fields:
        stats = c.stats or {}
        total += stats.get("distinct", 0) + 2 if c.kind != "numeric" else c.bucketize + 1
    return total


def train_epoch(trainer, model, reader, progress) -> tuple[float, int]:
    losses, rows = [], 0
    # From where the job is in this epoch (a resume, a rollback): trainer.prefetching puts the
    # reader back at that batch (torch/loop.py).
    for b in trainer.prefetching(reader, convert=TabularBatch.torch):
        loss = F.binary_cross_entropy_with_logits(model(b["dense"], b["ids"], b["offsets"], b["weights"]),
                                                  b["labels"])
        trainer.step(loss)
        losses.append(loss.item())
        rows += len(b["labels"])
        if progress:
            progress.advance(f"loss {np.mean(losses[-50:]):.4f}")
    return float(np.mean(losses)) if losses else float("nan"), rows


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    check(args)
    env = ps.init()
    tid, trainers, chief = env.trainer_id, env.num_trainers, env.trainer_id == 0

    def say(text):
        if chief:
            print(text, flush=True)

    schema = load_schema(args.schema, args.train, args.skip_bad_lines, say)
    torch.manual_seed(args.seed)
    tables = dict(table_optimizer=ps.optim.Adagrad(lr=args.table_lr), capacity=capacity_hint(schema))
    if not env.mode.has_servers:       # collective: no servers, every trainer holds hashed tables whole
        tables = dict(embedding=hashed_embedding(args.buckets))
        say(f"collective mode: tables of {args.buckets} hashed rows on every trainer, trained with Adam "
            f"(lr {args.lr}) like the other dense parameters")
    model = build_model(args.model, schema, dim=args.dim, hidden=args.hidden, **tables) \
        if args.model != "lr" else build_model("lr", schema, **tables)
    trainer = ps.Trainer(model, optimizer=ps.optim.Adam(lr=args.lr))
    reader = TabularReader(args.train, schema, args.batch_size, shard=(tid, trainers), shuffle=True,
                           seed=args.seed, equal_steps=True, skip_bad_lines=args.skip_bad_lines)
    say(f"{args.model} on {schema.num_dense} dense features and {schema.num_fields} id fields; {trainers} "
        f"trainer(s), {len(env.servers)} server(s), {env.mode} mode; {len(reader)} steps of {args.batch_size} "
        f"rows per trainer per epoch")
    history = {}       # by epoch: an epoch run again after a rollback replaces its first record
    trainer.log(total_steps=len(reader) * args.epochs)     # the launcher's progress shows an ETA
    for epoch in trainer.epochs(args.epochs):      # exact through rollbacks, --resume and restarts
        trainer.log(epoch=epoch)
        start = time.perf_counter()
        progress = StepProgress(len(reader), f"epoch {epoch}") if chief else None
        train_loss, rows = train_epoch(trainer, model, reader, progress)
        if progress:
            progress.close()
        seconds = time.perf_counter() - start
        ps.barrier("epoch-end")         # every trainer's pushes of this epoch are in
        trainer.pull()                  # dense values as the servers hold them (async: others' pushes too)
        if chief:
            test = evaluate(model, TabularReader(args.test, schema, 8192, skip_bad_lines=args.skip_bad_lines))
            history[epoch] = {"epoch": epoch, "train_loss": train_loss, "seconds": round(seconds, 3),
                              "samples_per_s": round(rows * trainers / seconds, 1), **test}
            trainer.log(test_auc=test["auc"], test_logloss=test["logloss"])
            say(f"epoch {epoch}: train loss {train_loss:.4f}  test AUC {test['auc']:.4f}  logloss "
                f"{test['logloss']:.4f}  accuracy {test['accuracy']:.4f}  "
                f"{rows * trainers / seconds:,.0f} samples/s")
            if reader.bad_lines:
                say(f"  skipped {reader.bad_lines} malformed lines, e.g. {reader.bad_line_examples[0]}")
        ps.barrier("evaluated")         # nobody trains on while trainer 0 reads the model
    if chief and args.json and history:
        final = {k: history[max(history)][k] for k in ("auc", "logloss", "accuracy", "rows")}
        out = {"model": args.model, "trainers": trainers, "servers": len(env.servers), "mode": env.mode,
               "epochs": [history[e] for e in sorted(history)], "final": final}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
        say(f"wrote {args.json}")
    trainer.close()
    return 0


def run() -> int:
    try:
        return main()
    except ParamshardError as exc:
        print(f"paramshard.apps.ctr: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(run())
