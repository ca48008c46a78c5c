"""First touch end to end: forward + step of batches of fresh ids through a trainer, by row store.

One ``python -m paramshard server`` subprocess (async, ``PARAMSHARD_ROW_STORE`` =
each store named by ``--stores``), this process the trainer: a model that is
one ``ps.SparseEmbedding`` (dim 16, Adagrad) summed into a logit. Every step
pulls ``--batch`` ids never seen before (the server creates every row), runs
forward, backward and ``trainer.step()`` (push, server update). Reported per
store: rows/s of the whole step (median over steps), the slowest step, and the
table size reached; the stores run one after the other, each in a fresh server.

    .venv/bin/python benchmarks/first_touch_trainer.py [--batch 1000000] [--steps 20] [--stores compiled,numpy]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

DIM = 16


def run(store: str, batch: int, steps: int, timeout: float) -> dict:
    import torch

    import paramshard as ps
    from paramshard.env import ClusterEnv
    from paramshard.placement.sparse_hash import mix64
    from paramshard.transport.links import ServerLinks

    children = C.Children()
    try:
        (addr,) = C.start_paramshard_cluster(children, 1, 1, mode="async", timeout=timeout,
                                             extra_env={"PARAMSHARD_ROW_STORE": store})
        links = ServerLinks([addr], timeout=timeout, who="bench")
        try:
            C.wait_servers(children, links)
        finally:
            links.close()

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = ps.SparseEmbedding("ids", DIM, optimizer=ps.optim.Adagrad(lr=0.05))
                self.out = torch.nn.Linear(DIM, 1)

            def forward(self, ids):
                return self.out(self.emb(ids)).squeeze(1)

        env = ClusterEnv(role="trainer", servers=(addr,), num_trainers=1, trainer_id=0, mode="async",
                         timeout=timeout)
        model = Model()
        trainer = ps.Trainer(model, optimizer=ps.optim.SGD(lr=0.01), env=env)
        times = []
        try:
            for step in range(steps):
                ids = torch.from_numpy(mix64(np.arange(step * batch, (step + 1) * batch, dtype=np.uint64))
                                       .view(np.int64)).view(-1, 1)
                labels = torch.zeros(batch)
                started = time.perf_counter()
                loss = torch.nn.functional.binary_cross_entropy_with_logits(model(ids), labels)
                loss.backward()
                trainer.step()
                times.append(time.perf_counter() - started)
            rows = sum(t["rows"] for t in trainer.server_stats()[0].get("tables", {}).values())
        finally:
            trainer.close()
        return {"median_s": statistics.median(times), "slowest_s": max(times), "rows": rows,
                "rate": batch / statistics.median(times)}
    finally:
        children.stop_all()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1_000_000, help="fresh ids per step")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--stores", default="compiled,numpy")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    C.install_sigterm_as_exit()
    print(C.machine_note(), flush=True)
    results = {}
    for store in args.stores.split(","):
        results[store] = run(store, args.batch, args.steps, args.timeout)
        r = results[store]
        print(f"{store}: {r['rate'] / 1e6:.2f}M rows/s (median step {r['median_s'] * 1e3:.0f} ms, slowest "
              f"{r['slowest_s'] * 1e3:.0f} ms), table {r['rows']:,} rows", flush=True)
    if args.markdown:
        base = results.get("numpy")
        print("\n| store | fresh ids a step | rows/s (median step) | median step ms | slowest step ms | rows at end | vs numpy |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for store, r in results.items():
            ratio = f"{r['rate'] / base['rate']:.2f}x" if base else "-"
            print(f"| {store} | {args.batch:,} | {r['rate'] / 1e6:.2f}M | {r['median_s'] * 1e3:.0f} | "
                  f"{r['slowest_s'] * 1e3:.0f} | {r['rows']:,} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
