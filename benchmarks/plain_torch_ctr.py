"""The CTR app's model trained in one plain PyTorch process: the twin of a paramshard run.

The same model class (paramshard.models.build_model), the same schema and
TabularReader encoding, the same metrics (paramshard.inference.evaluation.evaluate); only
the tables differ: local ``nn.EmbeddingBag(sparse=True)`` tables over a dense
index of the ids the training rows hold (built in one pass before training),
instead of SparseEmbedding tables on servers. A known id's row starts as
paramshard's would (placement.sparse_hash.initial_rows with the table's seed);
an id the training rows never hold reads a row of zeros (paramshard reads its
initial row, values in [-0.01, 0.01): a negligible difference).

Optimizers as the app's: torch.optim.Adam at --lr on the dense parameters,
torch.optim.Adagrad at --table-lr on the tables (sparse gradients, paramshard's
Adagrad defaults). With --shards N, a step is N batches of --batch-size rows
together, batch k of each of the N shards the app's trainers read (the same
TabularReader shards, seed and shuffle): the rows of one step of a sync job of N
trainers, whose servers average the N gradients as one mean over the N batches
does. So the twin sees the same rows in the same steps as the paramshard job
and only the framework differs (in one standalone process, the app's losses
and the twin's agree step for step, to the last printed digit). --shards 1 (the default) reads the file whole.

With --valid, each epoch ends with an evaluation on it and the app's own rule
(apps/ctr/selection.py) decides: the best epoch (highest validation AUC) is
kept, an epoch without a gain multiplies the rates by --lr-decay, --patience of
them in a row stop training (--epochs is the maximum), and the best epoch's
model is the one tested. Without --valid, every epoch runs and the last one is tested.

    python benchmarks/plain_torch_ctr.py --train T.csv --test E.csv --schema fitted.json --model deepfm \\
        --shards 2 --batch-size 256 --json out.json
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import zlib
from pathlib import Path

import numpy as np


def training_ids(paths, schema, batch_size: int = 8192) -> np.ndarray:
    """Every distinct feature id of the training rows, sorted (the plain user's vocabulary)."""
    from paramshard.data.readers.tabular import TabularReader
    seen = [np.unique(b.ids.reshape(-1)) for b in TabularReader(paths, schema, batch_size)]
    return np.unique(np.concatenate(seen)) if seen else np.empty(0, np.int64)


def local_tables(vocab: np.ndarray, init_scale: float = 0.01):
    """An ``embedding=`` factory: one EmbeddingBag per table, row 1 + i for ``vocab[i]``, row 0 for the rest."""
    import torch
    import torch.nn as nn
    from paramshard.placement.sparse_hash import initial_rows

    class LocalTable(nn.EmbeddingBag):
        def __init__(self, name: str, dim: int):
            # the seed paramshard gives the table (models/_common.default_embedding): the same starting rows
            seed = zlib.crc32(name.encode()) & 0x7FFFFFFF
            rows = np.zeros((len(vocab) + 1, dim), np.float32)
            rows[1:] = initial_rows(seed, vocab.view(np.uint64), dim, init_scale)
            super().__init__(len(rows), dim, mode="sum", sparse=True, _weight=torch.from_numpy(rows))

        def forward(self, ids, offsets=None, per_sample_weights=None):
            flat = ids.detach().numpy().reshape(-1)
            at = np.searchsorted(vocab, flat)
            found = (at < len(vocab)) & (vocab[np.minimum(at, len(vocab) - 1)] == flat)
            rows = torch.from_numpy(np.where(found, at + 1, 0).astype(np.int64).reshape(ids.shape))
            return super().forward(rows, offsets, per_sample_weights)

    return LocalTable


def build(args, schema, vocab):
    import torch
    from paramshard.models import build_model
    torch.manual_seed(args.seed)          # the app seeds torch the same way before building its model
    factory = local_tables(vocab)
    if args.model == "lr":
        return build_model("lr", schema, embedding=factory)
    return build_model(args.model, schema, dim=args.dim, hidden=args.hidden, embedding=factory)


def optimizers(model, lr: float, table_lr: float):
    import torch
    import torch.nn as nn
    from paramshard import optim
    tables = [m.weight for m in model.modules() if isinstance(m, nn.EmbeddingBag)]
    table_ids = {id(p) for p in tables}
    dense = [p for p in model.parameters() if id(p) not in table_ids]
    ada, adam = optim.Adagrad(lr=table_lr), optim.Adam(lr=lr)
    return (torch.optim.Adagrad(tables, lr=table_lr, initial_accumulator_value=ada.initial_accumulator_value,
                                eps=ada.eps),
            torch.optim.Adam(dense, lr=lr, betas=adam.betas, eps=adam.eps))


def steps(readers):
    """One pass: step k is batch k of every reader, together (readers with equal_steps: as many each)."""
    from paramshard.data.features.batch import TabularBatch
    for parts in zip(*readers):
        yield parts[0] if len(parts) == 1 else TabularBatch.concat(parts)


def train_epoch(model, readers, opts) -> float:
    import torch.nn.functional as F
    from paramshard.data.features.batch import TabularBatch
    losses = []
    for b in steps(readers):
        t = TabularBatch.torch(b)
        for o in opts:
            o.zero_grad(set_to_none=True)
        loss = F.binary_cross_entropy_with_logits(model(t["dense"], t["ids"], t["offsets"], t["weights"]),
                                                  t["labels"])
        loss.backward()
        for o in opts:
            o.step()
        losses.append(loss.item())
    return float(np.mean(losses)) if losses else float("nan")


def selection(args):
    """The app's own model-selection rule (apps/ctr/selection.py: best validation AUC, learning
    rates x --lr-decay after an epoch without a gain, a stop after --patience of them): the
    twin differs from the app only in the framework, not in when it stops or decays."""
    from paramshard.apps.ctr.selection import Selection
    return Selection("auc", args.patience, args.lr_decay, args.lr_decay_after)


def run(args) -> dict:
    from paramshard.specs.schema import Schema
    from paramshard.data.readers.tabular import TabularReader
    from paramshard.inference.evaluation import evaluate
    start = time.perf_counter()
    schema = Schema.load(args.schema)
    vocab = training_ids(args.train, schema)
    model = build(args, schema, vocab)
    opts = optimizers(model, args.lr, args.table_lr)
    readers = [TabularReader(args.train, schema, args.batch_size, shard=(i, args.shards), shuffle=True,
                             seed=args.seed, equal_steps=True) for i in range(args.shards)]
    history, scores, best_state, best_epoch, rule = [], [], None, None, selection(args)
    for epoch in range(1, args.epochs + 1):
        for r in readers:
            # Pass e of each reader in epoch e, as the app's trainer.epochs() reads (trainer/loop.py): the
            # same shuffle. A bare loop would start at pass 0, the same rows in another order.
            r.restore({"epoch": epoch, "batches": 0})
        t0 = time.perf_counter()
        train_loss = train_epoch(model, readers, opts)
        record = {"epoch": epoch, "train_loss": train_loss, "seconds": round(time.perf_counter() - t0, 3)}
        if args.valid:
            record["valid"] = evaluate(model, TabularReader(args.valid, schema, 8192))
        history.append(record)
        if not args.valid:
            continue
        scores.append(record["valid"]["auc"])
        decision = rule.decide(scores)
        if decision.improved:
            best_state, best_epoch = copy.deepcopy(model.state_dict()), epoch
        if decision.stop:
            break
        if decision.decay:
            for o in opts:
                for group in o.param_groups:
                    group["lr"] *= args.lr_decay
    if best_state is not None:
        model.load_state_dict(best_state)
    test = evaluate(model, TabularReader(args.test, schema, 8192))
    out = {"model": args.model, "batch_size": args.batch_size, "shards": args.shards, "lr": args.lr,
           "table_lr": args.table_lr, "vocabulary": int(len(vocab)), "epochs": history, "final": test,
           "seconds": round(time.perf_counter() - start, 3)}
    if best_epoch is not None:
        out["best"] = {**test, "epoch": best_epoch}
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train", nargs="+", required=True)
    p.add_argument("--test", nargs="+", required=True)
    p.add_argument("--valid", nargs="+", help="validation files: early stopping and the best epoch kept")
    p.add_argument("--schema", required=True)
    p.add_argument("--model", default="deepfm",
                   choices=("lr", "widedeep", "deepfm", "dcn", "dcnv2", "xdeepfm", "autoint"))
    p.add_argument("--epochs", type=int, default=3, help="the most epochs (with --valid) or every epoch")
    p.add_argument("--patience", type=int, default=2, help="epochs without a better validation AUC to stop after")
    p.add_argument("--lr-decay", type=float, default=0.1, help="learning rates x this after an epoch without a gain")
    p.add_argument("--lr-decay-after", type=int, default=1,
                   help="decay after every this many epochs without a gain (the app's, from its --json settings)")
    p.add_argument("--batch-size", type=int, default=256, help="rows per shard per step (the app's per-trainer batch)")
    p.add_argument("--shards", type=int, default=1, help="the app's trainers: a step reads a batch of each shard")
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--hidden", default="128,64")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--table-lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    p.add_argument("--json", required=True, metavar="OUT")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    args.hidden = tuple(int(h) for h in args.hidden.split(",") if h.strip())
    if min(args.epochs, args.patience, args.batch_size, args.shards) < 1:
        raise SystemExit("--epochs, --patience, --batch-size and --shards must be >= 1")
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    out = run(args)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
