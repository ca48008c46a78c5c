"""Where a 100-row /predict request's time goes inside `paramshard serve`, measured in-process.

The request path of serving/http.py without the socket: the body's JSON parsed (as the front
parses it), the rows encoded (``encoder.batch_of_rows``), the forward with its two table lookups
(``replica.score_batch``), the reply's JSON; each timed with perf_counter, ``--requests`` times
over 16 different bodies (warm caches, as a serving replica's), torch on one thread as `serve`
runs it. No client, no other thread, no delta applying: the figures are the work of a request, and
are far less moved by the machine's other load than serving_requests.py's latencies (which add the
HTTP layers, the loopback and the waits for a core); the thread's CPU time per stage (p50) leaves
out even this process's waits for a core. The model and requests are
serving_requests.py's (DeepFM dim 16 over 13 numeric and 26 categorical columns, Criteo-shaped).

    PYTHONPATH=src python benchmarks/serving_stages.py --rows 1000000
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000, help="rows per table")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--request-rows", type=int, default=100)
    args = p.parse_args()

    import torch
    from serving_requests import serving_model_dir      # this directory, as the script runs
    from paramshard.online.delta_format import Delta, TableChange
    from paramshard.online.delta_log import DeltaLog
    from paramshard.serving import http
    from paramshard.serving.replica import Replica

    torch.set_num_threads(1)           # as `paramshard serve --threads 1` (its default)
    parse = getattr(http, "parse_json", json.loads)     # an older tree parses with json
    g = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="serving-stages-") as tmp:
        root = Path(tmp) / "deltas"
        model, tables, encoder = serving_model_dir(root, 16)     # serving_requests.py's model
        bodies, used = [], []
        for _ in range(16):
            rows = [{**{f"I{i}": str(int(g.integers(0, 1000))) for i in range(1, 14)},
                     **{f"C{i}": f"v{int(g.zipf(1.2)) % 100_000}" for i in range(1, 27)}}
                    for _ in range(args.request_rows)]
            bodies.append(json.dumps({"rows": rows}).encode())
            used.append(encoder.encode(encoder.from_rows(rows)).ids.astype(np.uint64).ravel())
        used = np.unique(np.concatenate(used))
        ids = np.union1d(used, g.integers(1 << 40, 1 << 62, args.rows, dtype=np.uint64))[:args.rows]
        ids = np.union1d(used, ids)
        DeltaLog(root).publish(Delta("snapshot", 0, 0, 0, time.time(), {
            name: TableChange(ids, g.standard_normal((len(ids), t.dim), dtype=np.float32) * 0.01,
                              np.zeros(0, np.uint64)) for name, t in tables.items()}, {}))
        replica = Replica(root).start()
        wall: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}
        names = ("parse", "encode", "forward", "reply", "total")

        def now():           # (wall clock, this thread's CPU time): the CPU time leaves out the waits for a core
            return time.perf_counter(), time.thread_time()

        for k in range(args.requests + 50):
            body = bodies[k % len(bodies)]
            t0 = now()
            rows = parse(body)["rows"]
            t1 = now()
            batch = replica.encoder.batch_of_rows(rows)
            t2 = now()
            scores, version = replica.score_batch(batch)
            t3 = now()
            json.dumps({"scores": scores.tolist(), "version": version}).encode()
            t4 = now()
            if k >= 50:                  # the first ones fill the encoder's caches
                for clock, out in ((0, wall), (1, cpu)):
                    for name, (a, b) in zip(names, ((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t0, t4))):
                        out.setdefault(name, []).append((b[clock] - a[clock]) * 1e3)
        replica.close()
    load = open("/proc/loadavg").read().split()[:3]
    print(f"{args.requests} requests of {args.request_rows} rows, {len(ids):,} rows a table, in-process "
          f"(load average {' '.join(load)}); ms:")
    print("wall p50 / p99: " + ", ".join(f"{n} {np.quantile(v, .5):.3f} / {np.quantile(v, .99):.3f}"
                                         for n, v in wall.items()))
    print("CPU p50: " + ", ".join(f"{n} {np.quantile(v, .5):.3f}" for n, v in cpu.items()))


if __name__ == "__main__":
    main()
