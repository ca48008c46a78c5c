"""A trainer of an elastic GEO job for the e2e test (tests/e2e/test_elastic_launch.py): SGD lr=3
on w with the loss sum(c * w), c an integer vector (its gradient): a round's change is -3 x the
sum of its c's, and its delta (/ 3 trainer slots) that sum exactly. Each process writes the sum
of its c's once close() sent its last round. Trainer 0 stays: after the STOP file it waits for
every other process's sum, pulls the servers' values and writes them (final.npy)."""
import glob
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn

import paramshard as ps

folder = sys.argv[1]
SIZE = 64
env = ps.init()


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.arange(SIZE, dtype=torch.float32))     # the initial values: 0..63

    def forward(self, c):
        return (self.w * c).sum()


model = Model()
trainer = ps.Trainer(model, ps.optim.SGD(lr=3.0))
pid = os.getpid()
open(os.path.join(folder, f"started-{pid}"), "w").close()
print(f"trainer {env.trainer_id} first step {trainer.step_count}", flush=True)
rng = np.random.default_rng(pid)
total = np.zeros(SIZE, np.int64)
stop = os.path.join(folder, "stop")
while not os.path.exists(stop) and not trainer.leave_requested:
    c = rng.integers(-3, 4, SIZE)
    total += c
    trainer.step(model(torch.from_numpy(c.astype(np.float32))))
    if trainer.step_count % 10 == 0:
        print(f"trainer {env.trainer_id} at step {trainer.step_count}", flush=True)
    time.sleep(0.01)
print(f"trainer {env.trainer_id} ends at step {trainer.step_count} (leave requested: "
      f"{trainer.leave_requested})", flush=True)
if env.trainer_id == 0:
    others = [p for p in glob.glob(os.path.join(folder, "started-*")) if not p.endswith(f"-{pid}")]
    deadline = time.monotonic() + 60
    while not all(os.path.exists(p.replace("started-", "sum-") + ".npy") for p in others):
        assert time.monotonic() < deadline, "the other trainers did not write their sums"
        time.sleep(0.05)
    trainer.pull()                      # sends this trainer's round in progress first
    np.save(os.path.join(folder, "final.npy"), model.w.detach().numpy())
    np.save(os.path.join(folder, f"sum-{pid}.npy"), total)
    trainer.close()
else:
    trainer.close()                     # sends the round in progress, then leaves
    np.save(os.path.join(folder, f"sum-{pid}.npy"), total)
