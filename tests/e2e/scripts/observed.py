"""A small job for the run-directory test: dense + sparse, a fixed number of steps,
loss from step(loss) and a metric of its own through trainer.log. Trainer 0 writes
what the servers report at the end to OUT/server_stats.json and, with
--metrics-port given, scrapes its server 0's /metrics twice while training (each time once
the counters have moved on)."""
import argparse
import json
import time
import urllib.request
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from prometheus_client.parser import text_string_to_metric_families

import paramshard as ps

p = argparse.ArgumentParser()
p.add_argument("--out", type=Path, required=True)
p.add_argument("--steps", type=int, default=60)
p.add_argument("--metrics-port", type=int, default=0)
args = p.parse_args()

env = ps.init()


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = ps.SparseEmbedding("features", 8)
        self.head = nn.Linear(8 + 4, 1)

    def forward(self, dense, ids):
        return self.head(torch.cat([self.emb(ids), dense], dim=1)).squeeze(1)


torch.manual_seed(env.trainer_id)
model = Model()
trainer = ps.Trainer(model, optimizer=ps.optim.SGD(lr=0.1))
trainer.log(total_steps=args.steps, epoch=1)
scrapes = []


def requests_served(text: str) -> float:
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "paramshard_server_requests_total")


def scrape_past(served: float, deadline_s: float = 30.0) -> str:
    """Server 0's /metrics once it shows more than ``served`` requests. Its figures are the
    snapshot its loop takes about once a second: a trainer that started fast (a forked rank)
    can ask before the first one, or twice within one. After the deadline, the last scrape
    (the test then fails on it)."""
    deadline = time.monotonic() + deadline_s
    while True:
        with urllib.request.urlopen(f"http://127.0.0.1:{args.metrics_port}/metrics", timeout=10) as r:
            text = r.read().decode()
        if requests_served(text) > served or time.monotonic() > deadline:
            return text
        time.sleep(0.1)


for step in range(args.steps):
    dense, ids = torch.randn(32, 4), torch.randint(0, 500, (32, 3))
    labels = (dense[:, 0] > 0).float()
    trainer.step(F.binary_cross_entropy_with_logits(model(dense, ids), labels))
    trainer.log(my_metric=step / args.steps)
    if env.trainer_id == 0 and args.metrics_port and step in (5, args.steps - 5):
        scrapes.append(scrape_past(requests_served(scrapes[-1]) if scrapes else 0))
    time.sleep(0.03)          # long enough for a few records a trainer
trainer.barrier("done")
if env.trainer_id == 0:
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "server_stats.json").write_text(json.dumps(trainer.server_stats()))
    (args.out / "scrapes.json").write_text(json.dumps(scrapes))
trainer.close()
