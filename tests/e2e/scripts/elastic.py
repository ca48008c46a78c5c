"""An elastic job's trainer for the e2e tests: its own deterministic batches (seeded by trainer
and step), one epoch of a loader long enough to outlast the test, ended by the STOP file or
by a leave request (``paramshard scale`` down: ``epochs()`` and ``prefetching()`` end at the
next step boundary, then ``close()`` leaves)."""
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn

import paramshard as ps

stop = sys.argv[1]
env = ps.init()
torch.manual_seed(0)
model = nn.Linear(4, 2)
trainer = ps.Trainer(model, ps.optim.SGD(lr=0.01))
print(f"trainer {env.trainer_id} first step {trainer.step_count}", flush=True)


def batches():
    for _ in range(100_000):
        rng = np.random.default_rng(1000 * env.trainer_id + trainer.step_count)
        yield torch.from_numpy(rng.normal(size=(3, 4)).astype(np.float32))


for epoch in trainer.epochs(1):
    for x in trainer.prefetching(batches()):
        trainer.step(model(x).pow(2).mean())
        if trainer.step_count % 10 == 0:
            print(f"trainer {env.trainer_id} at step {trainer.step_count}", flush=True)
        if os.path.exists(stop):
            break
        time.sleep(0.03)
print(f"trainer {env.trainer_id} ends at step {trainer.step_count} (leave requested: "
      f"{trainer.leave_requested})", flush=True)
trainer.close()
