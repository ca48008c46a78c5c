"""`paramshard serve` under deltas: request latency of 100-row predictions while deltas of 100k rows apply.

Makes a delta directory here: a DeepFM (dim ``--dim``) over 13 numeric and 26 categorical columns
(a Criteo-shaped schema, no fitting), a snapshot of ``--rows`` rows in its "deep" table (the rows
the requests use plus random ones) and as many in "wide"; starts `paramshard serve` on it (one
process, loopback, ``--row-store``); then for ``--duration`` seconds a client sends requests of
``--request-rows`` rows (100) back to back on one keep-alive connection while this process
publishes a delta of ``--delta-rows`` rows to each table every ``--every`` seconds (half of
them rows the requests read: their answers change). Reports the client's latency (p50, p95, p99,
max), where it went (the replies' Server-Timing: reading and parsing the body, encoding the rows,
the forward with its lookups, the reply's JSON; the rest is the transport: the client's and the
server's HTTP code and the loopback), the deltas the replica applied (its version), its own apply
time and longest lookup stall, and how many requests the fast encoder took (/health).

    PYTHONPATH=src python benchmarks/serving_requests.py --rows 10000000
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _common import install_sigterm_as_exit  # noqa: E402


def serving_model_dir(root: Path, dim: int):
    """A delta directory ``root`` holding the benchmark's model (a DeepFM over 13 numeric and 26
    categorical columns, tables empty): (model, its tables, a RowEncoder of its model file).
    serving_stages.py builds the same one."""
    from paramshard.data import Column, Label, Schema
    from paramshard.inference.serving import model_dict, sparse_entry, write_model_file
    from paramshard.models import build_model
    from paramshard.serving.rows import RowEncoder
    from paramshard.specs.model_spec import spec_of
    from paramshard.tables import Admission
    from paramshard.trainer.sparse_embedding import tables_of

    schema = Schema(Label("click"), [Column(f"I{i}", transforms=["log"]) for i in range(1, 14)]
                    + [Column(f"C{i}", "categorical") for i in range(1, 27)])
    model = build_model("deepfm", schema, dim=dim, hidden=[64, 32])
    tables = tables_of(model)
    root.mkdir()
    sparse = {n: sparse_entry(np.zeros(0, np.uint64), np.zeros((0, t.dim), np.float32), t.dim, t.spec.seed,
                              t.spec.init_scale, "float32", Admission()) for n, t in tables.items()}
    write_model_file(model_dict(0, None, {n: q.detach().numpy() for n, q in model.named_parameters()}, sparse,
                                spec_of(model)), root / "model.pt")
    (root / "blocks.json").write_text("{}")
    return model, tables, RowEncoder(model, root / "model.pt")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--request-rows", type=int, default=100)
    p.add_argument("--delta-rows", type=int, default=100_000)
    p.add_argument("--every", type=float, default=2.0)
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--row-store", default="compiled")
    args = p.parse_args()
    install_sigterm_as_exit()

    from paramshard.online.delta_format import Delta, TableChange
    from paramshard.online.delta_log import DeltaLog, file_name

    g = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="serving-requests-") as tmp:
        root = Path(tmp) / "deltas"
        model, tables, encoder = serving_model_dir(root, args.dim)
        requests = []
        for _ in range(64):
            rows = [{**{f"I{i}": str(int(g.integers(0, 1000))) for i in range(1, 14)},
                     **{f"C{i}": f"v{int(g.zipf(1.2)) % 100_000}" for i in range(1, 27)}}
                    for _ in range(args.request_rows)]
            requests.append(json.dumps({"rows": rows}).encode())
            ids = encoder.encode(encoder.from_rows(rows)).ids.astype(np.uint64)
            if len(requests) == 1:
                used = np.unique(ids)
            else:
                used = np.union1d(used, ids)
        filler = g.integers(1 << 40, 1 << 62, args.rows, dtype=np.uint64)
        ids = np.unique(np.concatenate([used, filler]))[:args.rows]
        ids = np.union1d(used, ids)[:max(args.rows, len(used))]
        log = DeltaLog(root)
        started = time.perf_counter()
        log.publish(Delta("snapshot", 0, 0, 0, time.time(), {
            name: TableChange(ids, g.standard_normal((len(ids), t.dim), dtype=np.float32) * 0.01,
                              np.zeros(0, np.uint64)) for name, t in tables.items()}, {}))
        print(f"snapshot of {len(ids):,} rows x 2 tables written in {time.perf_counter() - started:.1f} s; "
              f"requests of {args.request_rows} rows read {len(used):,} distinct ids", flush=True)
        src = str(Path(__file__).resolve().parent.parent / "src")
        proc = subprocess.Popen([sys.executable, "-m", "paramshard", "serve", str(root), "--port", "0", "--poll", "0.2",
                                 "--row-store", args.row_store], stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": src})
        try:
            started = time.perf_counter()
            line = proc.stdout.readline()
            if " at http://" not in line:
                raise SystemExit(f"paramshard serve did not start: {line!r}")
            url = line.split(" at http://", 1)[1].split()[0]
            host, port = url.split(":")
            print(f"serving after {time.perf_counter() - started:.1f} s (load, both copies)", flush=True)
            stop = threading.Event()
            published = []
            # The deltas are made before the clock starts and published by a rename each (atomic, as
            # DeltaLog.publish's own last step): making one (random rows, its checksum, its file) in
            # this process while it times requests would time this process's GIL, not the server.
            staging = DeltaLog(root.parent / (root.name + "-staging"))
            count = int(args.duration / args.every) + 2
            for seq in range(1, count + 1):
                half = args.delta_rows // 2
                change_ids = np.unique(np.concatenate([used[g.integers(0, len(used), half)],
                                                       g.integers(1 << 40, 1 << 62, half, dtype=np.uint64)]))
                staging.publish(Delta("delta", 0, seq, seq, time.time(), {
                    name: TableChange(change_ids, g.standard_normal((len(change_ids), t.dim), dtype=np.float32),
                                      np.zeros(0, np.uint64)) for name, t in tables.items()}, {}))
            print(f"{count} deltas of ~{args.delta_rows:,} rows x 2 tables made ahead", flush=True)

            def publish():
                seq = 0
                while not stop.wait(args.every) and seq < count:
                    seq += 1
                    name = file_name("delta", seq)
                    os.rename(staging.server_dir(0) / name, log.server_dir(0) / name)
                    published.append(seq)

            publisher = threading.Thread(target=publish, daemon=True)
            connection = http.client.HTTPConnection(host, int(port), timeout=30)
            latencies, versions, stages = [], set(), []
            for body in requests[:4]:        # warm-up
                connection.request("POST", "/predict", body, {"Content-Type": "application/json"})
                connection.getresponse().read()
            publisher.start()
            end = time.monotonic() + args.duration
            k = 0
            while time.monotonic() < end:
                t0 = time.perf_counter()
                connection.request("POST", "/predict", requests[k % len(requests)], {"Content-Type": "application/json"})
                reply = connection.getresponse()
                data = reply.read()
                latencies.append(time.perf_counter() - t0)
                if reply.status != 200:
                    raise SystemExit(f"HTTP {reply.status}: {data[:300]!r}")
                versions.add(json.loads(data)["version"]["servers"]["0"])
                timing = reply.getheader("Server-Timing")
                if timing:             # "read;dur=0.123, encode;dur=..." (ms)
                    stages.append({part.split(";dur=")[0].strip(): float(part.split(";dur=")[1])
                                   for part in timing.split(",")})
                k += 1
            stop.set()
            publisher.join(timeout=30)
            time.sleep(1.0)
            connection.request("GET", "/health")
            health = json.loads(connection.getresponse().read())
            lat = np.asarray(latencies) * 1e3
            print(f"{len(lat):,} requests of {args.request_rows} rows: p50 {np.quantile(lat, .5):.2f} ms, "
                  f"p95 {np.quantile(lat, .95):.2f} ms, p99 {np.quantile(lat, .99):.2f} ms, max {lat.max():.1f} ms")
            if len(stages) == len(lat):
                names = list(stages[0])
                parts = {n: np.asarray([st[n] for st in stages]) for n in names}
                parts["transport"] = lat - sum(parts.values())
                print("where it went (ms, p50 / p99): " + ", ".join(
                    f"{n} {np.quantile(v, .5):.2f} / {np.quantile(v, .99):.2f}" for n, v in parts.items()))
            print(f"deltas of ~{args.delta_rows:,} rows x 2 tables published: {len(published)}; versions seen by the "
                  f"client: {len(versions)}; served at the end: seq {health['version']['servers']}")
            print(f"replica: apply (both copies) last {health['apply_s']['last'] * 1e3:.0f} ms, max "
                  f"{health['apply_s']['max'] * 1e3:.0f} ms; longest wait to start a lookup "
                  f"{health['max_lookup_stall_s'] * 1e3:.2f} ms; requests encoded {health.get('encoded')}")
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


if __name__ == "__main__":
    main()
