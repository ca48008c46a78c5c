"""The combination matrix's training script (tests/e2e/test_elastic_matrix.py), shaped like the
README's loop: trainer.epochs + (optionally) trainer.prefetching over DynamicShards, a sparse
table with the row format the case asks for, a dense layer.

Data: libsvm lines ``label id:1`` whose id is the line number. Every step also pushes a gradient
of exactly -1 to row ``id`` of the table ``count`` (SGD, lr 1, rows start at 0) for each record it
trains, so after the job row ``id`` holds how often the servers applied record ``id`` (async; sync:
1/n for a step n trainers pushed): what the servers hold can be checked against what the trainers
trained, which each process appends to LOGS/ids-<slot>-<pid>.txt after each step as
``STEP: ID ID ...`` (an empty list: a sync step without a task).

While the file HOLD exists the trainers pace themselves (the test scales the job meanwhile);
the first process of slot 1 stops between two steps at --pause-at (every push answered) and
says "ready", to be killed there. At the end: a barrier, then trainer 0 exports ``count``
to LOGS/count.npz.
"""
import argparse
import os
import time

import torch
import torch.nn as nn

import paramshard as ps
from paramshard.data import DynamicShards, LibsvmReader

p = argparse.ArgumentParser()
p.add_argument("data")
p.add_argument("logs")
p.add_argument("hold")
p.add_argument("--prefetch", choices=["on", "off"], default="on")
p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
p.add_argument("--pause-at", type=int, default=0)
p.add_argument("--batch", type=int, default=8)
args = p.parse_args()

env = ps.init()
first = not os.environ.get("PARAMSHARD_JOINING")


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = ps.SparseEmbedding("emb", 8, optimizer=ps.optim.Adagrad(lr=0.05), dtype=getattr(torch, args.dtype))
        # lr 1 and init 0: row id ends at the number of times the servers applied record id
        self.count = ps.SparseEmbedding("count", 1, optimizer=ps.optim.SGD(lr=1.0), init_scale=0.0,
                                        dtype=getattr(torch, args.dtype))
        self.out = nn.Linear(8, 1)

    def forward(self, ids):
        return self.out(self.emb(ids)).squeeze(1), self.count(ids).sum()


torch.manual_seed(0)
model = Model()
trainer = ps.Trainer(model, ps.optim.SGD(lr=0.01))
loader = DynamicShards(LibsvmReader(args.data, args.batch), task_bytes=2000, trainer=trainer)


def tensors(batch):
    """(ids [n, 1] int64, labels [n]): tensors, so trainer.prefetching finds the ids to pull ahead."""
    return torch.from_numpy(batch.ids.astype("int64")).view(-1, 1), torch.from_numpy(batch.labels)


batches = trainer.prefetching(loader, convert=tensors) if args.prefetch == "on" else map(tensors, loader)
print(f"trainer {env.trainer_id} first step {trainer.step_count}", flush=True)
with open(os.path.join(args.logs, f"ids-{env.trainer_id}-{os.getpid()}.txt"), "a") as log:
    for epoch in trainer.epochs(1):
        for ids, labels in batches:
            if len(ids):
                score, counted = model(ids)
                trainer.step((score - labels).pow(2).mean() - counted)
            else:
                trainer.step(None)      # sync: a trainer without a task still steps
            log.write(f"{trainer.step_count}: " + " ".join(str(i) for i in ids.view(-1).tolist()) + "\n")
            log.flush()
            if trainer.step_count % 10 == 0:
                print(f"trainer {env.trainer_id} at step {trainer.step_count}", flush=True)
            if env.trainer_id == 1 and first and args.pause_at and trainer.step_count == args.pause_at:
                trainer.backend.flush()
                print("trainer 1 ready to be killed", flush=True)
                time.sleep(600)
            if trainer.leave_requested:
                break
            if os.path.exists(args.hold):
                time.sleep(0.03)
left = trainer.leave_requested
print(f"trainer {env.trainer_id} ends at step {trainer.step_count} (leave requested: {left})", flush=True)
if not left:
    trainer.barrier("matrix-end")       # every pushed step is on the servers
    if env.trainer_id == 0:
        trainer.export_table("count", os.path.join(args.logs, "count.npz"))
        print("trainer 0 exported the counts", flush=True)
trainer.close()
