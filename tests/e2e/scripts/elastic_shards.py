"""An elastic job's trainer reading its data through the shard service (DynamicShards): libsvm
lines ``label id:1`` whose id is the line number, so the ids each step trained are the records
it took; each process appends them to LOGS/ids-<slot>-<pid>.txt after every step. The first
process of slot 1 stops between two steps at STOP_AT (every push and report answered) and
says "ready", to be killed there; the test joins and removes trainers around it. Once the test
writes LOGS/hold (before it asks for the last joiner), every process slows to a step every 0.5 s
until that joiner (slot 2, joining) has trained its first batch and written LOGS/joined, so the
data does not run out before it arrives on a loaded machine (the joiner's start took > 5 s under
load 10). After that nothing more happens to the job: every process trains the rest of the epoch
unpaced."""
import os
import sys
import time

import torch
import torch.nn as nn

import paramshard as ps
from paramshard.data import DynamicShards, LibsvmReader

data, logs, stop_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
env = ps.init()
model = nn.Linear(1, 1)
trainer = ps.Trainer(model, ps.optim.SGD(lr=0.01))
first = not os.environ.get("PARAMSHARD_JOINING")
loader = DynamicShards(LibsvmReader(data, 4), task_bytes=400, trainer=trainer)
print(f"trainer {env.trainer_id} first step {trainer.step_count}", flush=True)
hold, joined = os.path.join(logs, "hold"), os.path.join(logs, "joined")
last_joiner = env.trainer_id == 2 and not first and os.path.exists(hold)


def pace():
    """A step every 0.5 s while the last joiner is on its way (others must not end the data before
    it joins; they cannot just wait: a sync joiner's first pull needs their pushes); none once it
    trained a batch (the test disturbs the job no more: the rest of the epoch need not wait);
    0.03 s before the test's disturbances, so that the data lasts until they are done."""
    if os.path.exists(joined):
        return
    time.sleep(0.5 if os.path.exists(hold) else 0.03)


with open(os.path.join(logs, f"ids-{env.trainer_id}-{os.getpid()}.txt"), "a") as log:
    for epoch in trainer.epochs(1):
        for batch in trainer.prefetching(loader):
            x = torch.from_numpy(batch.labels).view(-1, 1)
            trainer.step(model(x).sum() if len(batch) else None)
            log.write(" ".join(str(i) for i in batch.ids.tolist()) + "\n")
            log.flush()
            if last_joiner and len(batch) and not os.path.exists(joined):
                open(joined, "w").close()      # a batch of its own trained and logged: its share is > 0
            if trainer.step_count % 10 == 0:
                print(f"trainer {env.trainer_id} at step {trainer.step_count}", flush=True)
            if env.trainer_id == 1 and first and trainer.step_count == stop_at:
                trainer.backend.flush()
                print("trainer 1 ready to be killed", flush=True)
                time.sleep(300)
            pace()
print(f"trainer {env.trainer_id} ends at step {trainer.step_count} (leave requested: "
      f"{trainer.leave_requested})", flush=True)
trainer.close()
