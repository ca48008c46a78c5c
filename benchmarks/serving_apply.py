"""Serving while a delta applies (paramshard/serving/versions.py): apply time and lookup latency.

One table of ``--rows`` rows (dim ``--dim``) in two copies (the replica's), in ``--store`` (the
servers' row stores: compiled, numpy, or compiled with ``--memory-budget``). A reader thread looks
up requests of ``--request-ids`` ids (100 rows x 26 sparse features: 2600) back to back from the
live copy, as a prediction does, while the main thread applies a delta of ``--delta-rows`` rows
(half of them rows the table holds, half new; values changed) every ``--every`` seconds for
``--duration`` seconds. Lookups are timed one by one, split into those that overlapped an apply
and those that did not.

Reports: apply seconds (both copies, the version switch and the grace wait included) median and
max; lookup latency p50/p95/p99/max while applying and while idle, and how many took over 10 ms
(the issue's "pause"); the longest a lookup waited to start (the version switch's lock). A pause
would show as a lookup max while applying far above the idle one: both copies are never locked
against readers, so what remains is the GIL (this process is one interpreter): the row store's
kernels release it (server/storage/kernels), the apply's Python between them holds it. On a
machine other jobs load, the idle figures show what the scheduler alone costs.

    PYTHONPATH=src python benchmarks/serving_apply.py --rows 10000000 --delta-rows 100000 --every 2
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--delta-rows", type=int, default=100_000)
    p.add_argument("--every", type=float, default=2.0)
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--request-ids", type=int, default=2600)
    p.add_argument("--store", default="compiled", choices=("compiled", "numpy"))
    p.add_argument("--memory-budget", default=None)
    args = p.parse_args()

    from paramshard.budgets import parse_budget
    from paramshard.serving.live_table import StoreChoice, TableCopy, TableSettings
    from paramshard.serving.versions import DoubleBuffer

    choice = StoreChoice(args.store, parse_budget(args.memory_budget, "--memory-budget"))
    settings = TableSettings("deep", args.dim, 0, 0.01)
    copies = [TableCopy(settings, choice, c) for c in "ab"]
    g = np.random.default_rng(0)
    ids = g.permutation(np.arange(1, 2 * args.rows + 1, dtype=np.uint64))[:args.rows]
    started = time.perf_counter()
    for copy in copies:
        for s in range(0, args.rows, 1 << 20):
            copy.upsert(ids[s:s + (1 << 20)], np.zeros((len(ids[s:s + (1 << 20)]), args.dim), np.float32))
    print(f"{args.rows:,} rows x dim {args.dim} in 2 copies ({args.store}"
          f"{', budget ' + args.memory_budget if args.memory_budget else ''}): loaded in "
          f"{time.perf_counter() - started:.1f} s", flush=True)
    buffer = DoubleBuffer(copies[0], copies[1], {"seq": 0}, grace=30.0)
    applying = threading.Event()
    stop = threading.Event()
    busy, idle = [], []

    def read():
        r = np.random.default_rng(1)
        while not stop.is_set():
            want = ids[r.integers(0, args.rows, args.request_ids)]
            during = applying.is_set()
            t0 = time.perf_counter()
            with buffer.reading() as (copy, version):
                copy.lookup(want)
            took = time.perf_counter() - t0
            (busy if during or applying.is_set() else idle).append(took)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    applies, seq, end = [], 0, time.monotonic() + args.duration
    while time.monotonic() < end:
        seq += 1
        half = args.delta_rows // 2
        held = ids[g.integers(0, args.rows, half)]
        fresh = np.arange(1, args.delta_rows - half + 1, dtype=np.uint64) + np.uint64(10 * args.rows + seq * args.delta_rows)
        delta_ids = np.unique(np.concatenate([held, fresh]))
        values = np.full((len(delta_ids), args.dim), seq, np.float32)
        applying.set()
        t0 = time.perf_counter()
        buffer.apply(lambda copy: copy.upsert(delta_ids, values), {"seq": seq})
        applies.append(time.perf_counter() - t0)
        applying.clear()
        time.sleep(max(0.0, args.every - applies[-1]))
    stop.set()
    reader.join(timeout=10)

    def q(xs, f):
        return np.quantile(np.asarray(xs), f) * 1e3 if xs else float("nan")

    print(f"applies: {len(applies)} of ~{args.delta_rows:,} rows, median {statistics.median(applies) * 1e3:.1f} ms, "
          f"max {max(applies) * 1e3:.1f} ms (both copies)")
    for name, xs in (("while applying", busy), ("idle", idle)):
        over = sum(x > 0.010 for x in xs)
        print(f"lookups of {args.request_ids} ids {name}: {len(xs):,}, p50 {q(xs, .5):.3f} ms, p95 {q(xs, .95):.3f} ms, "
              f"p99 {q(xs, .99):.3f} ms, max {q(xs, 1.0):.3f} ms; over 10 ms: {over} ({100 * over / max(len(xs), 1):.2f}%)")
    print(f"longest wait to start a lookup (version switch): {buffer.max_stall_s * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
