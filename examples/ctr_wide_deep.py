"""CTR demo: a wide & deep model on Criteo-format data, sparse tables on the servers.

    paramshard launch --servers 2 --trainers 2 examples/ctr_wide_deep.py
    python examples/ctr_wide_deep.py --train-rows 100000      # one process
    python examples/ctr_wide_deep.py --table-dtype float16    # half-precision rows on the servers
    paramshard launch --servers 2 --trainers 2 --checkpoint-dir runs/ckpt examples/ctr_wide_deep.py
                                        # keeps the trained model: see examples/evaluate.py
    paramshard launch --servers 2 --trainers 2:3 --partitions 1024 examples/ctr_wide_deep.py
                                        # elastic: `paramshard scale RUN --trainers N / --servers N`;
                                        # the shard service hands out the data (DynamicShards)

With no --data, trainer 0 generates synthetic Criteo-like data from a hidden
logistic model (so the best possible AUC is known) and splits it into one
shard per trainer; every trainer then reads only its own shard. Give --data
DIR (written by `paramshard split-data`) and --test FILE to use real data.
"""
import argparse
import fcntl
import os
import shutil
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import paramshard as ps
from paramshard.data import CriteoReader, DynamicShards, criteo_schema, generate_criteo, shard_files, split_lines
from paramshard.models import WideDeep
from paramshard.observe.report.server_table import StepProgress, server_load_table
from paramshard.trainer.epochs import start_at


def prepare_synthetic(root: Path, train_rows: int, test_rows: int, shards: int, trainer_id: int,
                      timeout: float = 600) -> tuple[Path, Path, float]:
    """Trainer 0 writes the data; the others wait for its 'ready' mark.

    The data directory appears complete or not at all (written under a temporary
    name, then renamed into place), so another run sharing the work directory
    never reads it half-written; the writers of concurrent runs take turns.
    """
    root = root / f"synthetic-{train_rows}-{test_rows}-{shards}shards"
    ready = root / "READY"
    if trainer_id == 0 and not ready.exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        with open(root.parent / f".{root.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)     # one writer at a time; released if this process dies
            if not ready.exists():               # not written by a run that held the lock before us
                write_synthetic(root, train_rows, test_rows, shards)
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"trainer {trainer_id}: no data from trainer 0 after {timeout} s at {root}")
        time.sleep(0.5)
    return root / "shards", root / "test.tsv", float(ready.read_text())


def write_synthetic(root: Path, train_rows: int, test_rows: int, shards: int) -> None:
    tmp = root.parent / f".{root.name}.{uuid.uuid4().hex[:12]}.tmp"
    tmp.mkdir()
    try:
        report = generate_criteo(tmp / "all.tsv", train_rows + test_rows, seed=0)
        with open(tmp / "all.tsv", "rb") as src, open(tmp / "train.tsv", "wb") as tr, \
                open(tmp / "test.tsv", "wb") as te:
            for i, line in enumerate(src):
                (tr if i < train_rows else te).write(line)
        os.remove(tmp / "all.tsv")
        split_lines([tmp / "train.tsv"], shards, tmp / "shards", force=True)
        (tmp / "READY").write_text(f"{report.hidden_auc}\n")
        if root.exists():   # left half-written by an interrupted run: replace it
            stale = tmp.with_suffix(".stale")
            os.replace(root, stale)
            shutil.rmtree(stale, ignore_errors=True)
        os.replace(tmp, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def as_tensors(b) -> tuple:
    """A CriteoBatch as (dense, ids, labels) tensors, the ids as int64 bit patterns."""
    return torch.from_numpy(b.dense), torch.from_numpy(b.sparse_ids.view(np.int64)), torch.from_numpy(b.labels)


def evaluate(model, test_path: Path, batch_size: int = 8192) -> tuple[float, float]:
    metrics = ps.evaluate(model, CriteoReader([test_path], batch_size))     # eval mode, no gradients
    return metrics["auc"], metrics["logloss"]


TABLE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def parser() -> argparse.ArgumentParser:
    """The options, shared with examples/evaluate.py (same data options, same test set)."""
    p = argparse.ArgumentParser()
    p.add_argument("--data", type=Path, help="directory of part-NNNNN shards (default: synthetic)")
    p.add_argument("--test", type=Path, help="test file in Criteo TSV format (with --data)")
    p.add_argument("--train-rows", type=int, default=400_000)
    p.add_argument("--test-rows", type=int, default=50_000)
    p.add_argument("--workdir", type=Path, default=Path("runs/ctr"))
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=1024, help="per trainer")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--table-dtype", choices=sorted(TABLE_DTYPES), default="float32",
                   help="how the servers store the embedding rows (half: 2 bytes a value; the maths stays float32)")
    p.add_argument("--stochastic-rounding", action="store_true",
                   help="round updated half-precision rows at random instead of to nearest")
    return p


def main():
    args = parser().parse_args()

    env = ps.init()
    tid, chief = env.trainer_id, env.trainer_id == 0
    if args.data:
        if not args.test:
            raise SystemExit("--data needs --test FILE for the evaluation")
        shards_dir, test_path, ceiling = args.data, args.test, None
    else:
        shards_dir, test_path, ceiling = prepare_synthetic(args.workdir, args.train_rows, args.test_rows,
                                                           env.num_trainers, tid)
    my_files = shard_files(shards_dir, tid, env.num_trainers)

    torch.manual_seed(0)
    table_opt = ps.optim.Adagrad(lr=args.lr)
    rows = {"dtype": TABLE_DTYPES[args.table_dtype], "stochastic_rounding": args.stochastic_rounding}
    model = WideDeep(criteo_schema(), dim=args.dim,      # 13 dense features, 26 id fields
                     embedding=lambda name, dim: ps.SparseEmbedding(name, dim, optimizer=table_opt, **rows))
    trainer = ps.Trainer(model, optimizer=ps.optim.Adam(lr=1e-3))
    if chief:
        print(f"{env.num_trainers} trainers, {len(env.servers)} servers, {env.mode} mode; "
              f"trainer 0 reads {[f.name for f in my_files]}", flush=True)
        if ceiling:
            print(f"hidden model AUC on this data (the ceiling): {ceiling:.4f}", flush=True)
        base = evaluate(model, test_path)
        print(f"before training: test AUC {base[0]:.4f}  logloss {base[1]:.4f}", flush=True)

    # An elastic job (--trainers MIN:MAX) takes its data from the shard service: trainers that join
    # or leave mid-epoch leave no record untrained or trained twice (docs/elastic.md).
    elastic = env.min_trainers is not None
    if elastic:
        loader = DynamicShards(CriteoReader(sorted(shards_dir.glob("part-*")), args.batch_size, skip_bad_lines=True),
                               trainer=trainer)
    if env.joining:     # a trainer that joined mid-job: the epoch the others are in (epoch-end barriers passed + 1)
        start_at(trainer, trainer.barrier_counts().get("epoch-end", 0) + 1)
    # trainer.epochs + trainer.prefetching: every batch is trained once, in order, through a server
    # restarted in place (--max-restarts), --resume and a whole-job restart.
    for epoch in trainer.epochs(args.epochs):
        start, seen, losses = time.perf_counter(), 0, []
        if elastic:
            steps, reader = None, loader.reader
            batches = trainer.prefetching(loader, convert=as_tensors)
        else:
            reader = CriteoReader(my_files, args.batch_size, skip_bad_lines=True)
            read = list(reader)
            # Sync steps must line up: every trainer takes the same number of steps.
            steps = min(len(read), args.train_rows // (args.batch_size * env.num_trainers))
            # prefetching: the next batch's rows are on their way while this one trains.
            batches = trainer.prefetching([as_tensors(b) for b in read[:steps]])
        progress = StepProgress(steps, f"epoch {epoch}") if chief and steps else None
        if steps:
            trainer.log(epoch=epoch, total_steps=steps * args.epochs)     # the launcher's live progress
        for dense, ids, labels in batches:
            if not len(labels):
                trainer.step()      # sync, elastic: no task left for this trainer, the others' step goes on
                continue
            loss = F.binary_cross_entropy_with_logits(model(dense, ids), labels)
            trainer.step(loss)
            seen += len(labels)
            losses.append(loss.item())
            if progress:
                rate = seen / (time.perf_counter() - start)
                progress.advance(f"loss {np.mean(losses[-50:]):.4f}  {rate:,.0f} samples/s per trainer")
            if trainer.leave_requested:     # `paramshard scale --trainers N` asked this one to leave
                break
        if progress:
            progress.close()
        if trainer.leave_requested:
            break                   # a leaver closes now: the epoch-end barrier is the others'
        elapsed = time.perf_counter() - start
        ps.barrier("epoch-end")     # async: the others' pushes of this epoch are in before the chief evaluates
        trainer.pull()
        if chief:
            test_auc, test_loss = evaluate(model, test_path)
            trainer.log(test_auc=test_auc)
            print(f"epoch {epoch}: train loss {np.mean(losses) if losses else float('nan'):.4f}  test AUC {test_auc:.4f}  "
                  f"logloss {test_loss:.4f}  {seen * env.num_trainers / elapsed:,.0f} samples/s "
                  f"(all trainers)", flush=True)
            if reader.bad_lines:
                print(f"  skipped {reader.bad_lines} malformed lines", flush=True)

    if chief:
        print(server_load_table(trainer.server_stats()), flush=True)
    trainer.close()     # with a checkpoint directory: also the final checkpoint, the model just evaluated
    if chief and env.checkpoint_dir:
        print(f"trained model in checkpoint {env.checkpoint_dir}; to run it without servers:\n"
              f"  paramshard export-model {env.checkpoint_dir} --out model.pt\n"
              f"  python examples/evaluate.py --model model.pt  (+ this run's data options)", flush=True)
    elif chief and env.mode in ("sync", "async"):     # collective and hybrid take no checkpoints yet
        print("to keep the trained model: paramshard launch --checkpoint-dir DIR ... examples/ctr_wide_deep.py "
              "(see examples/evaluate.py)", flush=True)


if __name__ == "__main__":
    main()
