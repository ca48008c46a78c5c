"""The training script of benchmarks/elastic_sync.py (run by `paramshard launch --mode sync`, once per
trainer): a big Adagrad table trained with trainer.prefetching on integer gradients, checked exactly.

1. Fill: the trainers pull every id of ``--rows`` (0 .. rows-1, half each, ``--fill-chunk`` ids a
   step, no gradient: the rows are created at their initial values and their accumulators stay 0).
2. Train with ``trainer.prefetching``: trainer t's batch k is ``batch(seed, t, k, ...)``: ``--batch``
   distinct ids of ``--hot`` hot ids and an integer gradient in [-3, 3] for each of their values
   (the loss is sum(rows * G), so the gradient of a row is its G). It trains until the step written
   in the file ``--stop`` (the benchmark writes it after its last move), then both trainers meet
   at a barrier (their pushes are on the servers after it).
3. Check (trainer 0): a sync step applies the sum of the trainers' gradients / T, so Adagrad's
   accumulator of a row is the sum over steps of ((g_0 + ... + g_{T-1}) / T)^2: with T = 2 and
   integer g, multiples of 1/4, exact in float32 whatever the order. The batches are made again
   from their seeds (``expected_accumulators``) and compared with every server's rows read page by
   page (snapshot_sparse): hot rows whose accumulator differs (a lost, doubled or split update),
   other rows whose accumulator is not 0, ids missing or held twice. The result goes to ``--result``
   (JSON) and one line of output.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

TABLE = "big"
GRAD = 3                 # gradients are integers in [-GRAD, GRAD]
PAGE = 1 << 18           # rows of one snapshot_sparse page


def hot_ids(rows: int, hot: int, seed: int) -> np.ndarray:
    """The ids the training batches take theirs from (distinct, among 0 .. rows-1)."""
    return np.sort(np.random.default_rng([seed, 7]).choice(rows, min(hot, rows), replace=False)).astype(np.int64)


def batch(seed: int, trainer: int, k: int, hot: int, size: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Trainer ``trainer``'s batch ``k``: positions into the hot ids (distinct) and their integer
    gradients [size, dim]; the same in every process (the check makes them again)."""
    rng = np.random.default_rng([seed, trainer, k])
    picks = rng.choice(hot, min(size, hot), replace=False)
    return picks, rng.integers(-GRAD, GRAD + 1, (len(picks), dim)).astype(np.float32)


def expected_accumulators(seed: int, trainers: int, steps: int, hot: int, size: int, dim: int) -> np.ndarray:
    """Adagrad's accumulator of each hot id after ``steps`` sync steps of ``trainers`` trainers:
    each step adds ((sum of that step's gradients of the id) / trainers)^2 (float64, exact)."""
    acc = np.zeros((hot, dim), np.float64)
    for k in range(steps):
        parts = [batch(seed, t, k, hot, size, dim) for t in range(trainers)]
        picks = np.concatenate([p for p, _ in parts])
        grads = np.concatenate([g for _, g in parts]).astype(np.float64)
        unique, inverse = np.unique(picks, return_inverse=True)
        summed = np.zeros((len(unique), dim))
        np.add.at(summed, inverse, grads)
        acc[unique] += (summed / trainers) ** 2
    return acc


def compare(ids: np.ndarray, acc: np.ndarray, hot: np.ndarray, want: np.ndarray, rows: int) -> dict:
    """Every row the servers hold (``ids``, their accumulators ``acc``) against the oracle: the hot
    ids' ``want``, 0 for every other id of 0 .. rows-1."""
    order = np.argsort(ids, kind="stable")
    ids, acc = ids[order], acc[order]
    doubled = int(np.count_nonzero(ids[1:] == ids[:-1]))
    in_range = (ids >= 0) & (ids < rows)
    missing = rows - len(np.unique(ids[in_range]))
    where = np.searchsorted(ids, hot)
    found = (where < len(ids)) & (ids[np.minimum(where, len(ids) - 1)] == hot)
    got = acc[np.minimum(where, len(ids) - 1)]
    wrong_hot = int(np.count_nonzero(~found | ~np.all(got == want.astype(np.float32), axis=1)))
    cold = np.ones(len(ids), bool)
    cold[where[found]] = False
    wrong_cold = int(np.count_nonzero(np.any(acc[cold] != 0, axis=1)))
    return {"rows_held": int(len(ids)), "ids_held_twice": doubled, "ids_missing": int(missing),
            "ids_foreign": int(np.count_nonzero(~in_range)), "hot_rows_wrong": wrong_hot,
            "cold_rows_touched": wrong_cold, "hot_rows": int(len(hot))}


def wrong_examples(ids, acc, hot, want, seed, trainers, steps, size, first, most=5) -> list[dict]:
    """For a few hot rows whose accumulator differs: by how much, and the steps that touched them
    (absolute step numbers): evidence of where an update went wrong."""
    order = np.argsort(ids, kind="stable")
    ids, acc = ids[order], acc[order]
    where = np.minimum(np.searchsorted(ids, hot), len(ids) - 1)
    bad = np.flatnonzero((ids[where] != hot) | ~np.all(acc[where] == want.astype(np.float32), axis=1))[:most]
    out = []
    for h in bad.tolist():
        touched = [first + k for k in range(steps)
                   if any(h in batch(seed, t, k, len(hot), size, want.shape[1])[0] for t in range(trainers))]
        out.append({"id": int(hot[h]), "got_minus_want": (acc[where[h]] - want[h]).tolist(), "steps": touched})
    return out


def read_accumulators(trainer) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Every live server's rows of the table: (ids, Adagrad accumulators, servers), page by page
    (only the ids and the slot are kept)."""
    backend = trainer.backend
    backend.follow_routing()
    servers = backend.sparse.routing.servers()
    ids, acc = [], []
    for server in servers:
        start = 0
        while True:
            header, arrays = backend.links.request(server, {"op": "snapshot_sparse", "table": TABLE, "start": start,
                                                            "count": PAGE})
            named = dict(zip(header["parts"], arrays))
            ids.append(np.array(named["ids"], np.int64))
            acc.append(np.array(named["slot0"], np.float32))
            start += PAGE
            if start >= header["rows"]:
                break
    return np.concatenate(ids), np.concatenate(acc), list(servers)


def stop_step(path: str) -> int | None:
    """The step the benchmark wrote into ``path`` (None: not yet)."""
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (FileNotFoundError, ValueError):    # ValueError: not written whole yet (it is renamed in place)
        return None


class Batches:
    """Trainer t's batches 0, 1, ... as (ids [size, 1] int64, gradients [size, dim], k), for ever."""

    def __init__(self, hot: np.ndarray, seed: int, trainer: int, size: int, dim: int):
        self.hot, self.seed, self.trainer, self.size, self.dim = hot, seed, trainer, size, dim

    def __iter__(self):
        k = 0
        while True:
            picks, grads = batch(self.seed, self.trainer, k, len(self.hot), self.size, self.dim)
            yield torch.from_numpy(self.hot[picks].reshape(-1, 1)), torch.from_numpy(grads), k
            k += 1


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--hot", type=int, default=200_000)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--fill-chunk", type=int, default=1 << 18)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop", required=True, help="file the benchmark writes the last step into")
    p.add_argument("--result", required=True, help="JSON file trainer 0 writes the check into")
    return p.parse_args(argv)


def main() -> int:
    import paramshard as ps
    args = parse_args()
    env = ps.init()
    tid, trainers = env.trainer_id, env.num_trainers

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = ps.SparseEmbedding(TABLE, args.dim, optimizer=ps.optim.Adagrad(lr=0.01), capacity=args.rows)
            self.dense = torch.nn.Linear(args.dim, 1)     # dense blocks move too; its gradient is its own

        def forward(self, ids, grads):
            rows = self.emb(ids)
            return (rows * grads).sum() + self.dense(rows.detach()).pow(2).mean()

    torch.manual_seed(0)
    model = Model()
    trainer = ps.Trainer(model, ps.optim.SGD(lr=0.001))
    began = time.monotonic()
    share = np.array_split(np.arange(args.rows, dtype=np.int64), trainers)[tid]
    chunks = -(-max(len(np.array_split(np.arange(args.rows), trainers)[0]), 1) // args.fill_chunk)
    for c in range(chunks):           # the same number of steps on every trainer (sync)
        part = share[c * args.fill_chunk:(c + 1) * args.fill_chunk]
        if len(part):
            model.emb(torch.from_numpy(part.reshape(-1, 1)))     # creates the rows; no gradient
        trainer.step()
    first = trainer.step_count
    print(f"trainer {tid}: filled {args.rows:,} rows in {time.monotonic() - began:.1f} s; training from step "
          f"{first}", flush=True)
    hot = hot_ids(args.rows, args.hot, args.seed)
    stop = None
    for ids, grads, k in trainer.prefetching(Batches(hot, args.seed, tid, args.batch, args.dim)):
        if k != trainer.step_count - first:
            raise SystemExit(f"trainer {tid}: batch {k} at step {trainer.step_count} (training began at {first})")
        if stop is None:
            stop = stop_step(args.stop)
            if stop is not None and stop < trainer.step_count:
                raise SystemExit(f"trainer {tid}: asked to stop at step {stop}, already at {trainer.step_count}: "
                                 f"the benchmark must leave a larger margin")
        if stop is not None and trainer.step_count >= stop:
            break
        trainer.step(model(ids, grads))
        if trainer.step_count % 200 == 0:
            print(f"trainer {tid} at step {trainer.step_count}", flush=True)
    trained = trainer.step_count - first
    trainer.barrier("trained")           # every trainer's last push is on the servers after it
    if tid == 0:
        began = time.monotonic()
        ids, acc, servers = read_accumulators(trainer)
        want = expected_accumulators(args.seed, trainers, trained, len(hot), args.batch, args.dim)
        check = {"steps": trained, "first_step": first, "trainers": trainers, "servers": servers,
                 **compare(ids, acc, hot, want, args.rows), "check_s": round(time.monotonic() - began, 1)}
        if check["hot_rows_wrong"]:
            check["examples"] = wrong_examples(ids, acc, hot, want, args.seed, trainers, trained, args.batch, first)
        tmp = args.result + ".tmp"
        with open(tmp, "w") as f:
            json.dump(check, f)
        os.replace(tmp, args.result)
        print(f"trainer 0: check {json.dumps(check)}", flush=True)
    trainer.barrier("checked")           # the servers stay until trainer 0 has read them
    trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
