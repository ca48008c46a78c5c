"""A sparse model trained until the STOP file appears (the servers-scale e2e test): ids from a
large range, so every server holds rows of every partition's share; prints its step every 20."""
import os
import sys
import time

import numpy as np
import torch

import paramshard as ps

stop = sys.argv[1]
env = ps.init()


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = ps.SparseEmbedding("emb", 8, optimizer=ps.optim.Adagrad(lr=0.1))
        self.out = torch.nn.Linear(8, 1)

    def forward(self, ids):
        return self.out(self.emb(ids)).squeeze(1)


torch.manual_seed(0)
model = Model()
trainer = ps.Trainer(model, ps.optim.SGD(lr=0.01))
rng = np.random.default_rng(env.trainer_id)
for epoch in trainer.epochs(1):
    for _ in range(1_000_000):
        ids = torch.from_numpy(rng.integers(0, 200_000, size=(32, 4)))
        trainer.step(model(ids).pow(2).mean())
        if trainer.step_count % 20 == 0:
            print(f"trainer {env.trainer_id} at step {trainer.step_count}", flush=True)
        if os.path.exists(stop) or trainer.leave_requested:      # asked to leave: `scale --trainers`
            break
        time.sleep(0.01)
print(f"trainer {env.trainer_id} ends at step {trainer.step_count} (leave requested: {trainer.leave_requested})",
      flush=True)
trainer.close()
