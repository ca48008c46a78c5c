"""A training script that checks itself: sync training through the servers must end
exactly where one plain PyTorch process ends with the combined batch.

Run by every engine test of `paramshard run` (and the Kubernetes execution test):
each trainer prints `trainer I of T: oracle ok ...` on success. With
`--fail-trainer I --fail-at-step K`, trainer I dies at step K (exit code 3),
for the tests that kill one rank.
"""
import argparse
import copy
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import paramshard as ps


def data(n=512):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 16, generator=g)
    y = (x @ torch.randn(16, 1, generator=g)).squeeze(1) + 0.1 * torch.randn(n, generator=g)
    return x, y


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--batch", type=int, default=8, help="per trainer")
    p.add_argument("--fail-trainer", type=int, default=-1)
    p.add_argument("--fail-at-step", type=int, default=3)
    args = p.parse_args()
    env = ps.init()
    tid, trainers = env.trainer_id, env.num_trainers
    x, y = data()
    net = model()
    reference = copy.deepcopy(net)
    with ps.Trainer(net, ps.optim.SGD(lr=0.05)) as trainer:
        share = ps.shard(torch.utils.data.TensorDataset(x, y), batch_size=args.batch, trainer_id=tid,
                         num_trainers=trainers)
        loader = torch.utils.data.DataLoader(share, batch_size=args.batch)
        losses = []
        for k, (xb, yb) in enumerate(loader):
            if k == args.steps:
                break
            if tid == args.fail_trainer and k == args.fail_at_step:
                print(f"trainer {tid}: failing on purpose at step {k}", file=sys.stderr, flush=True)
                os._exit(3)
            loss = F.mse_loss(net(xb).squeeze(1), yb)
            losses.append(loss.item())
            trainer.step(loss)
        stats = trainer.server_stats()

    # The same steps in one process: each step sees every trainer's batch (the mean of
    # the per-trainer mean losses, i.e. the mean over the combined batch).
    opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    combined = args.batch * trainers
    for k in range(len(losses)):
        xb, yb = x[k * combined:(k + 1) * combined], y[k * combined:(k + 1) * combined]
        opt.zero_grad()
        F.mse_loss(reference(xb).squeeze(1), yb).backward()
        opt.step()
    for (name, a), b in zip(net.named_parameters(), reference.parameters()):
        if not torch.allclose(a, b, rtol=1e-4, atol=1e-6):
            print(f"trainer {tid}: ORACLE FAILED on {name}: max diff {(a - b).abs().max().item():g}", flush=True)
            sys.exit(1)
    served = sum(1 for s in stats if s["requests"] > 0)
    print(f"trainer {tid} of {trainers}: oracle ok after {len(losses)} steps, loss {losses[0]:.4f} -> "
          f"{losses[-1]:.4f}, {served} of {len(stats)} servers served, servers {','.join(env.servers)}",
          flush=True)


if __name__ == "__main__":
    main()
