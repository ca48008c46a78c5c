"""Dense demo: an MLP on scikit-learn's handwritten digits, trained through
parameter servers.

    paramshard launch --servers 2 --trainers 2 examples/digits_mlp.py
    paramshard launch --servers 0 --trainers 2 --mode collective examples/digits_mlp.py
    python examples/digits_mlp.py          # one process, local server

Every trainer reads only its own shard of the training set; in sync mode all
trainers hold the same parameters after each step, so trainer 0 reports
test accuracy for everyone.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

import paramshard as ps
from paramshard.observe.report.server_table import server_load_table


def load_data(seed: int):
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    x, y = x[perm], y[perm]
    n_test = len(x) // 5
    return TensorDataset(x[n_test:], y[n_test:]), (x[:n_test], y[:n_test])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=32, help="per trainer")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    env = ps.init()   # a server rank serves here and exits
    torch.manual_seed(args.seed)
    train_set, (x_test, y_test) = load_data(args.seed)
    my_share = ps.shard(train_set, batch_size=args.batch_size)
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))
    trainer = ps.Trainer(model, optimizer=ps.optim.Adam(lr=args.lr))
    chief = env.trainer_id == 0
    if chief:
        # Collective and hybrid modes keep the dense parameters on the trainers: no plan of blocks.
        blocks = f", {len(trainer.plan.blocks)} blocks" if trainer.plan and trainer.plan.blocks else ""
        print(f"{env.num_trainers} trainers x {len(my_share)} samples, {len(env.servers)} servers, "
              f"{env.mode} mode{blocks}", flush=True)

    # trainer.epochs + trainer.prefetching: every batch is trained once, in order, through a server
    # restarted in place (--max-restarts), --resume and a whole-job restart.
    for epoch in trainer.epochs(args.epochs):
        # Same shuffle seed on every trainer keeps steps aligned batch for batch; a seed per epoch
        # makes the epoch's order the same when it is replayed.
        loader = DataLoader(my_share, batch_size=args.batch_size, shuffle=True,
                            generator=torch.Generator().manual_seed(args.seed + epoch - 1))
        total, batches = 0.0, 0
        for x, y in trainer.prefetching(loader):
            loss = F.cross_entropy(model(x), y)
            trainer.step(loss)
            total, batches = total + loss.item(), batches + 1
        trainer.pull()
        with torch.no_grad():
            acc = (model(x_test).argmax(1) == y_test).float().mean().item()
        if chief:
            print(f"epoch {epoch:2d}  loss {total / max(batches, 1):.4f}  test accuracy {acc:.3f}", flush=True)

    if chief and env.servers:
        print(server_load_table(trainer.server_stats()), flush=True)
    trainer.close()


if __name__ == "__main__":
    main()
