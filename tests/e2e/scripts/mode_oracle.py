"""One training script for every mode, with an oracle built in.

A model with a dense part (an MLP, Adam) and, unless --dense-only, a
SparseEmbedding table (Adagrad). Each trainer takes its share of every step's
combined batch; at the end trainer 0 writes the dense parameters and the rows of
every id to --out (JSON). The test runs it in one process with the whole batch
and under each mode, and compares: sync, collective and hybrid must end where
the single process ends.
"""
import argparse
import json

import numpy as np
import torch

import paramshard as ps

IDS = 60


class Model(torch.nn.Module):
    def __init__(self, sparse: bool):
        super().__init__()
        self.emb = ps.SparseEmbedding("emb", 4, optimizer=ps.optim.Adagrad(lr=0.1)) if sparse else None
        width = 6 + (4 if sparse else 0)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def forward(self, dense, ids):
        features = [self.emb(ids), dense] if self.emb is not None else [dense]
        return self.mlp(torch.cat(features, 1)).squeeze(1)


def data(n: int):
    rng = np.random.default_rng(7)
    dense = torch.from_numpy(rng.normal(size=(n, 6)).astype(np.float32))
    ids = torch.from_numpy(rng.integers(0, IDS, size=(n, 3)))
    label = ((dense[:, 0] + (ids[:, 0] % 3 == 0).float()) > 0.3).float()
    return dense, ids, label


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--batch", type=int, default=24, help="the combined batch of one step")
    p.add_argument("--dense-only", action="store_true")
    args = p.parse_args()
    env = ps.init()
    torch.manual_seed(0)
    model = Model(sparse=not args.dense_only)
    dense, ids, label = data(args.steps * args.batch)
    share = args.batch // env.num_trainers
    with ps.Trainer(model, ps.optim.Adam(lr=0.01)) as trainer:
        for step in range(args.steps):
            lo = step * args.batch + env.trainer_id * share
            rows = slice(lo, lo + share)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(dense[rows], ids[rows]), label[rows])
            trainer.step(loss)
        trainer.barrier()
        if env.trainer_id == 0:
            out = {f"mlp.{k}": v.tolist() for k, v in model.mlp.state_dict().items()}
            model.eval()
            with torch.no_grad():       # the chief alone: a forward that must need no other trainer
                out["predictions"] = torch.sigmoid(model(dense[:50], ids[:50])).tolist()
                if model.emb is not None:
                    out["emb.rows"] = model.emb(torch.arange(IDS).unsqueeze(1)).tolist()
            out["mode"] = env.mode
            with open(args.out, "w") as f:
                json.dump(out, f)


if __name__ == "__main__":
    main()
