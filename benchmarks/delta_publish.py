"""How long a server's loop stops to publish a delta and a snapshot of a big table (issue 33).

One in-process server (compiled row store) holds ROWS rows of DIM float32 values; a delta carries
TOUCHED of them. Printed: the delta's time on the loop (find the rows, gather, encode, write,
fsync), the snapshot's time on the loop (the consistent copy) and in its background thread
(encode, checksum, write, fsync), and the files' sizes.

    PYTHONPATH=src python benchmarks/delta_publish.py [ROWS] [TOUCHED]
"""
from __future__ import annotations

import sys
import tempfile
import time

import numpy as np

from paramshard.env import ClusterEnv
from paramshard.optim import SGD
from paramshard.server.assembly import build_server
from paramshard.server.services.delta_service import DeltaService
from paramshard.server.services.sparse_service import SparseService
from paramshard.tables import Admission, Eviction, policy_to_wire

DIM = 16


def main(rows: int = 1_000_000, touched: int = 100_000) -> None:
    with tempfile.TemporaryDirectory() as root:
        env = ClusterEnv(role=None, server_id=0, mode="async", delta_dir=root, delta_seconds=1e9)
        server = build_server(env, num_trainers=1, watch_peers=False, in_process=True)
        service = server.service(DeltaService)
        server.handle_local({"op": "register_sparse", "table": "t", "trainer": 0, "dim": DIM, "seed": 0,
                             "optimizer": SGD(lr=1.0).to_wire(),
                             "policy": policy_to_wire(Admission(), Eviction(), 0.0)}, [])
        ids = np.arange(1, rows + 1, dtype=np.uint64)
        server.handle_local({"op": "import_sparse", "table": "t", "trainer": 0},
                            [ids, np.random.default_rng(0).standard_normal((rows, DIM)).astype(np.float32)])
        service.last = -1e18                     # due now: the first publication, snapshot 0
        began = time.perf_counter()
        service.maybe_publish()
        on_loop = time.perf_counter() - began
        service.writer.join()
        in_thread = time.perf_counter() - began
        snap = service.log.latest_snapshot(0).path.stat().st_size
        print(f"snapshot of {rows} rows x {DIM}: {on_loop * 1e3:.0f} ms on the loop (the copy), "
              f"{in_thread * 1e3:.0f} ms until written by its thread, {snap / 2**20:.1f} MiB")
        table = server.service(SparseService).tables["t"]
        at = np.sort(np.random.default_rng(1).choice(rows, touched, replace=False))
        table.load(ids[at], np.ones((touched, DIM), np.float32))      # TOUCHED rows changed
        service.last = -1e18
        began = time.perf_counter()
        service.maybe_publish()
        took = time.perf_counter() - began
        entry = service.log.entries(0)[-1]
        print(f"delta of {touched} rows: {took * 1e3:.0f} ms on the loop, {entry.path.stat().st_size / 2**20:.2f} "
              f"MiB ({touched * (8 + 4 * DIM) / 2**20:.2f} MiB of ids and rows)")
        server.close()


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
