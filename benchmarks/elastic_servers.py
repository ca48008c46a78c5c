"""Servers added and removed under training: 2 -> 3 -> 2 servers holding a big table (issue 24, item 3).

``python -m paramshard server`` subprocesses (async, PARAMSHARD_PARTITIONS=``--partitions``):
servers 0 and 1 form the job, and before each 2 -> 3 one more is started under a new index, as
the launcher starts an added one (a removed server's index is never used again).
The chief fills a table of ``--rows`` rows (dim ``--dim``, Adagrad, rows at 0) by pulls; then
``--trainers`` trainer threads (each its own ServerLinks) pull and push integer gradients on
``--hot`` ids of the table while the coordinator (launch/server_scaling.move_partitions) moves
the partitions 2 -> 3 -> 2, ``--repeats`` times.

Per move it prints: seconds, partitions, rows and MiB moved, the longest hand-off, and the
longest single pull or push any trainer waited for during the move (its stall; the same figure
before any move is printed as the baseline). Lost or doubled updates: Adagrad's accumulator
of a row is the sum of its squared gradients, exact in float32 for integer gradients whatever
the order, so each hot row's accumulator read back at the end (snapshot_sparse) must equal the
sum the trainers kept: rows that differ are counted. Medians over the repeats at the end.

    .venv/bin/python benchmarks/elastic_servers.py [--rows 10000000] [--dim 16] [--trainers 8]
        [--repeats 3] [--partitions 1024] [--hot 200000]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Children  # noqa: E402

import paramshard as ps  # noqa: E402
from paramshard.client.sparse import SparseClient, TableSpec  # noqa: E402
from paramshard.env import ClusterEnv  # noqa: E402
from paramshard.launch.engines.local import child_environ  # noqa: E402
from paramshard.launch.engines.ports import free_ports  # noqa: E402
from paramshard.launch.elastic.server_scaling import move_partitions  # noqa: E402
from paramshard.placement.partitions import Routing  # noqa: E402
from paramshard.transport.links import ServerLinks  # noqa: E402

TABLE, GRAD, TIMEOUT = "big", 3, 120.0


def start_server(children: Children, addresses: list[str], i: int, trainers: int, partitions: int) -> None:
    """Server ``i``: 0 and 1 form the job; each later one is added by a scale, under a new index as
    the launcher adds one (a removed server's index is never used again)."""
    env = ClusterEnv(role="server", server_id=i, servers=tuple(addresses[:max(2, i + 1)]), num_trainers=trainers + 1,
                     mode="async", timeout=TIMEOUT, partitions=partitions)
    children.spawn(f"server {i}", [sys.executable, "-m", "paramshard", "server"], child_environ(env))


class Trainer(threading.Thread):
    """Pulls and pushes batches of hot ids until told to stop; keeps its squared-gradient sums and
    the longest wait of each window (``window()`` starts a new one)."""

    def __init__(self, t: int, addresses, routing, hot: np.ndarray, dim: int, batch: int):
        super().__init__(daemon=True)
        self.t, self.addresses, self.routing, self.hot, self.dim, self.batch = t, addresses, routing, hot, dim, batch
        self.stop = threading.Event()
        self.squares = np.zeros((len(hot), dim), np.int64)
        self.longest = 0.0
        self.steps = 0
        self.error: BaseException | None = None

    def window(self) -> float:
        longest, self.longest = self.longest, 0.0
        return longest

    def run(self):
        try:
            links = ServerLinks(self.addresses[:2], timeout=TIMEOUT)
            sparse = SparseClient(links, self.t + 1, self.routing)
            rng = np.random.default_rng(self.t)
            while not self.stop.is_set():
                pick = np.sort(rng.choice(len(self.hot), self.batch, replace=False))
                ids = self.hot[pick]
                g = rng.integers(-GRAD, GRAD + 1, (len(ids), self.dim))
                began = time.monotonic()
                sparse.pull_sparse(TABLE, ids, self.dim)
                mid = time.monotonic()
                sparse.push_sparse(TABLE, ids, g.astype(np.float32), self.steps)
                self.longest = max(self.longest, mid - began, time.monotonic() - mid)
                self.squares[pick] += g * g
                self.steps += 1
            links.close()
        except BaseException as exc:      # noqa: BLE001 - reported by the main thread
            self.error = exc


def accumulators(links, servers, ids: np.ndarray, dim: int, page: int = 1 << 18) -> dict[int, np.ndarray]:
    """Adagrad's accumulator (slot0) of ``ids``, read from each server's pages."""
    wanted = set(ids.tolist())
    out = {}
    for s in servers:
        start = 0
        while True:
            header, arrays = links.request(s, {"op": "snapshot_sparse", "table": TABLE, "start": start, "count": page})
            named = dict(zip(header["parts"], arrays))
            for i, acc in zip(named["ids"].tolist(), named["slot0"]):
                if i in wanted:
                    if i in out:
                        raise AssertionError(f"id {i} has a row on two servers")
                    out[i] = acc
            start += page
            if start >= header["rows"]:
                break
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--trainers", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--partitions", type=int, default=1024)
    p.add_argument("--hot", type=int, default=200_000, help="ids the trainers push to (a subset of the table)")
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--page-rows", type=int, default=65536)
    p.add_argument("--per-handoff", type=int, default=16)
    args = p.parse_args()
    children = Children()
    addresses = [f"127.0.0.1:{port}" for port in free_ports(2 + args.repeats)]
    routing = Routing.initial(args.partitions, addresses[:2])
    try:
        for i in range(2):
            start_server(children, addresses, i, args.trainers, args.partitions)
        chief = ServerLinks(addresses[:2], timeout=TIMEOUT)
        chief.wait_ready(60)
        sparse = SparseClient(chief, 0, routing)
        sparse.register_sparse(TableSpec(TABLE, args.dim, ps.optim.Adagrad(lr=0.1), init_scale=0.0,
                                         capacity=args.rows))
        began = time.monotonic()
        all_ids = np.arange(1, args.rows + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15 % (1 << 63))
        for lo in range(0, args.rows, 1 << 20):
            sparse.pull_sparse(TABLE, all_ids[lo:lo + (1 << 20)], args.dim)
        print(f"filled {args.rows:,} rows (dim {args.dim}, Adagrad) on 2 servers in {time.monotonic() - began:.1f} s",
              flush=True)
        hot = all_ids[np.random.default_rng(0).choice(args.rows, min(args.hot, args.rows), replace=False)]
        del all_ids
        trainers = [Trainer(t, addresses, routing, hot, args.dim, args.batch) for t in range(args.trainers)]
        for tr in trainers:
            tr.start()
        time.sleep(2.0)
        baseline = max(tr.window() for tr in trainers)
        print(f"{args.trainers} trainers: longest pull or push before any move {baseline * 1000:.0f} ms", flush=True)
        mover = ServerLinks(addresses[:2], timeout=TIMEOUT)
        moves = []
        for repeat in range(args.repeats):
            added = 2 + repeat
            start_server(children, addresses, added, args.trainers, args.partitions)
            with ServerLinks([addresses[added]], timeout=TIMEOUT) as fresh:
                fresh.wait_ready(60)        # its start is not the move's time
            for target in ([0, 1, added], [0, 1]):
                for tr in trainers:
                    tr.window()
                record = move_partitions(mover, addresses[:added + 1], target, per_handoff=args.per_handoff,
                                         page_rows=args.page_rows)
                stall = max(tr.window() for tr in trainers)
                errors = [tr.error for tr in trainers if tr.error]
                if errors:
                    raise errors[0]
                moves.append((f"{len(record.servers_before)}->{len(record.servers_after)}", record, stall))
                print(f"repeat {repeat}: {moves[-1][0]} servers: {record.ended - record.started:.2f} s, "
                      f"{record.partitions} partitions, {record.rows:,} rows, {record.bytes / 2**20:.0f} MiB, "
                      f"longest hand-off {record.longest_handoff_s * 1000:.0f} ms, max trainer stall "
                      f"{stall * 1000:.0f} ms (copy {record.copy_s:.1f} s, {record.handoffs} hand-offs "
                      f"{record.handoffs_s:.1f} s, drop {record.finish_s:.1f} s)", flush=True)
        for tr in trainers:
            tr.stop.set()
        for tr in trainers:
            tr.join(TIMEOUT)
        want = sum(tr.squares for tr in trainers)
        got = accumulators(mover, [0, 1], hot, args.dim)
        bad = sum(1 for i, w in zip(hot.tolist(), want) if i not in got or not np.array_equal(got[i], w))
        steps = sum(tr.steps for tr in trainers)
        print(f"{steps:,} pushes of {args.batch} rows; hot rows whose accumulator is not the sum of their squared "
              f"gradients (lost or doubled updates): {bad} of {len(hot):,}")
        for kind in ("2->3", "3->2"):
            of = [(r, s) for k, r, s in moves if k == kind]
            print(f"median {kind}: {statistics.median(r.ended - r.started for r, _ in of):.2f} s, max trainer stall "
                  f"{statistics.median(s for _, s in of) * 1000:.0f} ms, longest hand-off "
                  f"{statistics.median(r.longest_handoff_s for r, _ in of) * 1000:.0f} ms")
        mover.close()
        chief.close()
        return 1 if bad else 0
    finally:
        children.stop_all()


if __name__ == "__main__":
    sys.exit(main())
