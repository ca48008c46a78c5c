"""Async training in which one trainer dies on purpose (`--fail-trainer I`): the
others must train on to the end when the launcher runs with --min-trainers."""
import argparse
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import paramshard as ps


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--fail-trainer", type=int, default=-1)
    args = p.parse_args()
    env = ps.init()
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    g = torch.Generator().manual_seed(env.trainer_id)
    with ps.Trainer(model, ps.optim.SGD(lr=0.05)) as trainer:
        for k in range(args.steps):
            if env.trainer_id == args.fail_trainer and k == 3:
                print(f"trainer {env.trainer_id}: failing on purpose", file=sys.stderr, flush=True)
                os._exit(3)
            x = torch.randn(16, 8, generator=g)
            trainer.step(F.mse_loss(model(x).squeeze(1), x.sum(1)))
    print(f"trainer {env.trainer_id} done after {args.steps} steps", flush=True)


if __name__ == "__main__":
    main()
