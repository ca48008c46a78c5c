"""A step-indexed training loop that resumes where its checkpoint left off.

Batches are a function of (step, trainer), so a resumed run sees exactly the
batches the interrupted one would have seen. Trainer 0 prints
`final <sha256>` of the trained dense parameters and sparse rows (read from the
servers once the last step is complete everywhere).
"""
import argparse
import hashlib
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import paramshard as ps

DIM, VOCAB = 8, 200


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = ps.SparseEmbedding("feat", DIM, optimizer=ps.optim.Adagrad(lr=0.1), seed=5)
        self.mlp = nn.Sequential(nn.Linear(DIM, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, ids):
        return self.mlp(self.emb(ids)).squeeze(1)


def batch(step, trainer):
    g = np.random.default_rng(1000 * step + trainer)
    ids = torch.from_numpy((g.zipf(1.3, (16, 4)) % VOCAB).astype(np.int64))
    return ids, torch.from_numpy((g.random(16) < 0.4).astype(np.float32))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--stop-at", type=int, help="end normally after this step (a final checkpoint is saved)")
    p.add_argument("--step-delay", type=float, default=0.0)
    args = p.parse_args()
    env = ps.init()
    model = Model()
    with ps.Trainer(model, ps.optim.Adam(lr=0.01)) as trainer:
        print(f"trainer {env.trainer_id} starts at step {trainer.step_count}", flush=True)
        end = min(args.steps, args.stop_at or args.steps)
        while trainer.step_count < end:
            ids, y = batch(trainer.step_count, env.trainer_id)
            trainer.step(F.binary_cross_entropy_with_logits(model(ids), y))
            time.sleep(args.step_delay)
        if env.trainer_id == 0 and trainer.step_count == args.steps:
            h = hashlib.sha256()
            for p_ in model.parameters():
                if p_.requires_grad:
                    h.update(p_.detach().numpy().tobytes())
            every_id = np.arange(VOCAB, dtype=np.uint64)
            h.update(trainer.sparse.pull_sparse("feat", every_id, DIM, min_version=args.steps, create=False).tobytes())
            print(f"final {h.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
