"""Checkpoint write and read speed for a big sparse table (default 10M rows, dim 16, Adagrad).

Two ``python -m paramshard server`` subprocesses hold the table (filled by pulls
of new ids); the save is ``paramshard.client.checkpoint.save_checkpoint`` as a
chief's ``Trainer.save`` runs it (every row, value and Adagrad slot fetched in
pages, joined, written as .npy with CRC-32, committed atomically). The restore
goes onto two fresh servers (re-routed by id, one page per request). Reported:
bytes on disk, seconds and MB/s for each direction, medians of ``--reps``.

    .venv/bin/python benchmarks/checkpoint_speed.py [--rows 10000000] [--reps 3] [--markdown]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--dir", help="where to write (default: a temporary directory, removed after)")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    C.install_sigterm_as_exit()
    from paramshard.checkpoint.format import Checkpoint
    from paramshard.client.checkpoint import _restore_table, save_checkpoint
    from paramshard.client.sparse import SparseClient, TableSpec
    from paramshard.optim import Adagrad
    from paramshard.placement.sharding import make_plan
    from paramshard.transport.links import ServerLinks
    spec = TableSpec("big", args.dim, Adagrad(lr=0.05))
    plan = make_plan([], args.servers)
    root = args.dir or tempfile.mkdtemp(prefix="paramshard-ckpt-bench-")
    children, links = C.Children(), None
    writes, reads, nbytes = [], [], 0
    try:
        addresses = C.start_paramshard_cluster(children, args.servers, 1, mode="async", timeout=300.0)
        links = ServerLinks(addresses, timeout=300.0, who="bench")
        C.wait_servers(children, links)
        client = SparseClient(links, 0)
        client.register_sparse(spec)
        t = time.monotonic()
        for start in range(0, args.rows, 1_000_000):
            ids = np.arange(start, min(args.rows, start + 1_000_000), dtype=np.uint64) * np.uint64(2654435761)
            client.pull_sparse("big", ids, args.dim)
        print(f"filled {args.rows:,} rows in {time.monotonic() - t:.1f} s", flush=True)
        for rep in range(args.reps):
            path, nbytes, seconds = save_checkpoint(links, plan, {"big": spec}, root, rep + 1, {"mode": "async"},
                                                    keep=1)
            writes.append(seconds)
            print(f"save {rep + 1}: {nbytes / 1e6:.0f} MB in {seconds:.2f} s", flush=True)
        ckpt = Checkpoint(root)
        entry = ckpt.manifest["sparse"][0]
        links.close()
        links = None
        for rep in range(args.reps):
            fresh = C.Children()
            try:
                addresses = C.start_paramshard_cluster(fresh, args.servers, 1, mode="async", timeout=300.0)
                with ServerLinks(addresses, timeout=300.0, who="bench") as fresh_links:
                    C.wait_servers(fresh, fresh_links)
                    SparseClient(fresh_links, 0).register_sparse(spec)
                    t = time.monotonic()
                    parts = {part: ckpt.array(rel) for part, rel in entry["files"].items()}
                    _restore_table(fresh_links, entry, parts, 0)
                    reads.append(time.monotonic() - t)
                    print(f"restore {rep + 1}: {reads[-1]:.2f} s", flush=True)
            finally:
                fresh.stop_all()
    finally:
        if links is not None:
            links.close()
        children.stop_all()
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    mb = nbytes / 1e6
    rows = [("save (servers -> files)", f"{C.median(writes):.2f}", f"{mb / C.median(writes):.0f}"),
            ("restore (files -> fresh servers)", f"{C.median(reads):.2f}", f"{mb / C.median(reads):.0f}")]
    C.emit(args.markdown, [(f"checkpoint of a {args.rows:,}-row table, dim {args.dim}, Adagrad, {args.servers} servers "
                            f"({mb:.0f} MB on disk)", ["direction", "median s", "MB/s"], rows, [False, True, True])],
           [f"medians of {args.reps} runs; CRC-32 of every file checked on restore. {C.machine_note()}"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
