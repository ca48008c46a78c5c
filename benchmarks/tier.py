"""The disk tier (server/storage/tiered_row_store.py): a table under a memory budget against the same
table with every row in RAM, on a Zipf stream.

Two spawned processes each hold one SparseTable (async, the compiled store, dim ``--dim``,
optimizer ``--optimizer``): one unbounded, one with ``--budget`` (the table's
memory_budget; ``--budget-kind server``: a server budget on the process's RSS instead). Both
get the same stream: batches of ``--batch`` (100k) ids drawn from Zipf(``--exponent``, 1.05)
over ``--logical-ids`` (1e9) ranks (draws past the last rank are drawn again), each rank
hashed to an id (mix64, a bijection), pulled and pushed (its distinct ids, as a trainer
sends them) through ``SparseTable.pull`` and ``push``. Only pull+push is timed; the
stream is made outside the clock. The batches run in ``--rounds`` rounds, the two tables
alternating round by round (each round: the next batches, first on one, then on the
other), so both see the machine in the same state.

Memory: this process samples each table process's RSS (/proc/PID/statm) every
``--sample-ms`` (10) ms, from its own thread, so a sample can land in the middle of a
kernel call. Its RSS before the first batch (the interpreter, numpy, numba) is the
baseline; for a table budget "budget held" means max RSS - baseline <= budget * 1.02 + the
batch's own arrays (ids, row handles, pulled rows: the request's memory, not the table's); for
a server budget, max RSS <= budget * 1.02 + those.
The tier's files and the kernel's page cache of them are outside RSS (the page cache is
reclaimable once written back): the disk they take is reported.

Reports: rows/s (distinct rows pulled+pushed per timed second) of each table and their
ratio, the tier's hit rate, spills and promotions, max sampled RSS against the budget,
the distinct ids seen (the table's rows), the tier's disk use.

Sized so the unbounded table fits this machine: before starting it estimates the table
(rows from a sample of the stream x bytes per row) and refuses (exit 2) when that plus
the budget is above 60% of MemAvailable.

    .venv/bin/python benchmarks/tier.py [--quick] [--budget 4GB] [--logical-ids 1e9] [--batches 600]
        [--rounds 6] [--dim 64] [--optimizer adagrad] [--budget-kind table|server] [--markdown]
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

GiB, MiB = 1 << 30, 1 << 20
PLAIN, TIERED = "in RAM", "budget"
PAGE = os.sysconf("SC_PAGE_SIZE")


def zipf_batch(seed: int, batch: int, size: int, logical: int, exponent: float) -> np.ndarray:
    """Batch ``batch`` of the stream: ``size`` ids, Zipf ranks in 1..logical hashed to ids."""
    from paramshard.placement.sparse_hash import mix64
    rng = np.random.default_rng([seed, batch])
    out = np.empty(0, np.int64)
    while len(out) < size:
        draw = rng.zipf(exponent, size + size // 2)
        out = np.concatenate([out, draw[draw <= logical]])
    return mix64(out[:size].astype(np.uint64))


def table_bytes_per_row(dim: int, optimizer: str) -> float:
    """The compiled store's row (ids, values, the rule's state) and its index (~1/0.375 buckets)."""
    from paramshard.optim import KINDS
    from paramshard.update_rules import make_rule
    rule = make_rule(KINDS[optimizer]())
    state = sum(w for w in rule.slot_widths(dim)) * 4 + (4 if rule.uses_step else 0)
    return 8 + dim * 4 + state + 8 / 0.375


def worker(conn, variant: str, args: dict) -> None:
    """One table; answers ("run", first, count) with the round's figures, stops on None."""
    from paramshard.limits import Limits
    from paramshard.optim import KINDS
    from paramshard.server.core.barrier import Membership
    from paramshard.server.storage.row_stores import store_named
    from paramshard.server.storage.sparse_table import SparseTable
    from paramshard.server.storage.tiered_row_store import ServerBudget
    from paramshard.tables import Admission, Eviction
    tier = {}
    if variant == TIERED:
        tier["tier_dir"] = args["tier_dir"]
        if args["budget_kind"] == "server":
            tier["server_budget"] = ServerBudget(args["budget"])
        else:
            tier["memory_budget"] = args["budget"]
    table = SparseTable("t", args["dim"], 7, KINDS[args["optimizer"]](), Admission(), Eviction(), 0.01, "async",
                        Membership(1, 5.0), limits=Limits(max_rows=args["max_rows"]), store=store_named("compiled"),
                        **tier)
    grads = np.full((args["batch"], args["dim"]), 1e-3, np.float32)
    conn.send(("ready", os.getpid()))
    step = 0
    while True:
        msg = conn.recv()
        if msg is None:
            break
        _, first, count = msg
        seconds, rows = 0.0, 0
        for b in range(first, first + count):
            ids = np.unique(zipf_batch(args["seed"], b, args["batch"], args["logical_ids"], args["exponent"]))
            started = time.perf_counter()
            table.pull(ids, trainer=0)
            table.push(0, step, ids, grads[:len(ids)], distinct=True)
            seconds += time.perf_counter() - started
            rows += len(ids)
            step += 1
        tier_stats = table.tier_stats()
        disk = 0
        if variant == TIERED:
            for name in os.listdir(args["tier_dir"]):
                disk += os.stat(os.path.join(args["tier_dir"], name)).st_blocks * 512
        conn.send({"seconds": seconds, "rows": rows, "table_rows": table.num_rows, "tier": tier_stats,
                   "disk": disk, "nbytes": table.nbytes})
    table.close()


class Sampler:
    """Max RSS of each process by PID, sampled from a thread of this process."""

    def __init__(self, pids: dict[str, int], every: float):
        self.pids, self.every = pids, every
        self.max = {k: 0 for k in pids}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    @staticmethod
    def rss(pid: int) -> int:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            for k, pid in self.pids.items():
                try:
                    self.max[k] = max(self.max[k], self.rss(pid))
                except OSError:
                    pass
            self.samples += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def parse_args(argv=None):
    from paramshard.budgets import parse_budget
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a small run (< 1 min): 1e8 ids, 40 batches, 160 MiB budget, "
                                                         "dim 32")
    p.add_argument("--budget", default=None, help="the budget (default 4GB; quick: 160MiB)")
    p.add_argument("--budget-kind", choices=("table", "server"), default="table",
                   help="table: SparseEmbedding(memory_budget=); server: PARAMSHARD_MEMORY_BUDGET (the process's RSS)")
    p.add_argument("--logical-ids", type=float, default=None, help="Zipf ranks (default 1e9; quick: 1e8)")
    p.add_argument("--exponent", type=float, default=1.05)
    p.add_argument("--batch", type=int, default=100_000)
    p.add_argument("--batches", type=int, default=None, help="batches in all (default 600; quick: 40)")
    p.add_argument("--rounds", type=int, default=None, help="rounds the batches are split in (default 6; quick: 4)")
    p.add_argument("--dim", type=int, default=None, help="default 64; quick: 32")
    p.add_argument("--optimizer", default="adagrad")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--sample-ms", type=float, default=10.0)
    p.add_argument("--tier-dir", default=None, help="where the tier's files go (default: a temporary directory)")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    quick = args.quick
    args.budget = parse_budget(args.budget or ("160MiB" if quick else "4GB"), "--budget")
    args.logical_ids = int(args.logical_ids or (1e8 if quick else 1e9))
    args.batches = args.batches or (40 if quick else 600)
    args.rounds = args.rounds or (4 if quick else 6)
    args.dim = args.dim or (32 if quick else 64)
    return args


def estimate_rows(args) -> int:
    """Distinct ids the whole stream will make rows for: the distinct count of its first 4 and 16
    batches, extrapolated as a power of the batches (Zipf's distinct count grows as a power a
    little under 1 that falls slowly as the stream goes on: an estimate from above)."""
    first = min(args.batches, 16)
    seen = [zipf_batch(args.seed, b, args.batch, args.logical_ids, args.exponent) for b in range(first)]
    d16 = len(np.unique(np.concatenate(seen)))
    if args.batches <= first:
        return d16
    d4 = len(np.unique(np.concatenate(seen[:4])))
    power = min(1.0, math.log(d16 / d4) / math.log(first / 4))
    return int(d16 * (args.batches / first) ** power)


def main(argv=None) -> int:
    args = parse_args(argv)
    C.install_sigterm_as_exit()
    per_row = table_bytes_per_row(args.dim, args.optimizer)
    rows = estimate_rows(args)
    need = rows * per_row + args.budget
    if need > 0.6 * C.mem_available():
        print(f"refused: the unbounded table may take ~{rows * per_row / GiB:.1f} GiB ({rows} rows x {per_row:.0f} B) "
              f"and the budget {args.budget / GiB:.1f} GiB: more than 60% of MemAvailable "
              f"({C.mem_available() / GiB:.1f} GiB); fewer --batches or a smaller --dim", file=sys.stderr)
        return 2
    print(f"stream: Zipf({args.exponent}) over {args.logical_ids:.3g} ids, {args.batches} batches of {args.batch}, "
          f"{args.rounds} rounds; dim {args.dim} {args.optimizer}; budget {args.budget / GiB:.2f} GiB "
          f"({args.budget_kind}); unbounded table up to ~{rows * per_row / GiB:.2f} GiB", flush=True)
    children = C.Children()
    tier_parent = tempfile.mkdtemp(prefix="bench-tier-", dir=args.tier_dir)
    common = {"dim": args.dim, "optimizer": args.optimizer, "batch": args.batch, "logical_ids": args.logical_ids,
              "exponent": args.exponent, "seed": args.seed, "budget": args.budget, "budget_kind": args.budget_kind,
              "tier_dir": os.path.join(tier_parent, "t"), "max_rows": max(1 << 20, 2 * rows)}
    sampler = None
    try:
        conns = {v: children.start_mp(f"tier-{v}", worker, (v, common)) for v in (PLAIN, TIERED)}
        pids = {v: C.recv_with_timeout(c, 120, f"the {v} table")[1] for v, c in conns.items()}
        baseline = {v: Sampler.rss(pid) for v, pid in pids.items()}
        sampler = Sampler(pids, args.sample_ms / 1000)
        per_round = -(-args.batches // args.rounds)
        totals = {v: [0.0, 0] for v in conns}
        last = {}
        started = time.time()
        for r in range(args.rounds):
            first = r * per_round
            count = min(per_round, args.batches - first)
            if count <= 0:
                break
            order = (PLAIN, TIERED) if r % 2 == 0 else (TIERED, PLAIN)
            for v in order:
                conns[v].send(("run", first, count))
                last[v] = C.recv_with_timeout(conns[v], 3600, f"the {v} table")
                totals[v][0] += last[v]["seconds"]
                totals[v][1] += last[v]["rows"]
            t = last[TIERED]["tier"]
            print(f"  round {r + 1}/{args.rounds}: rows/s in RAM {last[PLAIN]['rows'] / last[PLAIN]['seconds']:,.0f}, "
                  f"budget {last[TIERED]['rows'] / last[TIERED]['seconds']:,.0f}; table rows "
                  f"{last[PLAIN]['table_rows']:,}; hits {t['hits']:,} misses {t['misses']:,}, spills {t['spills']:,}, "
                  f"promotions {t['promotions']:,}; max RSS {sampler.max[TIERED] / GiB:.2f} GiB "
                  f"({time.time() - started:.0f} s)", flush=True)
        sampler.stop()
    finally:
        if sampler is not None:
            sampler.stop()
        children.stop_all()
        import shutil
        shutil.rmtree(tier_parent, ignore_errors=True)
    rate = {v: totals[v][1] / totals[v][0] for v in totals}
    t = last[TIERED]["tier"]
    accesses = t["hits"] + t["misses"]
    grown = sampler.max[TIERED] - baseline[TIERED]
    # A batch's own arrays (its ids, row handles, the pulled rows) are the request's, not the table's.
    batch_bytes = args.batch * (args.dim * 4 + 32)
    held = (grown if args.budget_kind == "table" else sampler.max[TIERED]) <= args.budget * 1.02 + batch_bytes
    rows_table = [[v, f"{rate[v]:,.0f}", f"{rate[v] / rate[PLAIN]:.2f}", f"{sampler.max[v] / GiB:.2f}",
                   f"{(sampler.max[v] - baseline[v]) / GiB:.2f}"] for v in (PLAIN, TIERED)]
    notes = [
        f"distinct ids seen (table rows): {last[PLAIN]['table_rows']:,}; the unbounded table holds "
        f"{last[PLAIN]['nbytes'] / GiB:.2f} GiB",
        f"budget {args.budget / MiB:,.0f} MiB ({args.budget_kind}): max sampled RSS {sampler.max[TIERED] / MiB:,.0f} MiB, "
        f"{grown / MiB:,.0f} MiB ({grown / args.budget:.1%} of the budget) over the process's "
        f"{baseline[TIERED] / MiB:,.0f} MiB before the first batch "
        f"({sampler.samples} samples every {args.sample_ms:g} ms): budget {'held' if held else 'NOT held'} "
        f"(within budget + 2% + a batch's own arrays, {batch_bytes / (1 << 20):.0f} MiB)",
        f"tier: hit rate {t['hits'] / max(1, accesses):.3f} ({t['hits']:,} of {accesses:,} row accesses), "
        f"spills {t['spills']:,}, promotions {t['promotions']:,} (regions), resident estimate "
        f"{t['resident_bytes'] / GiB:.2f} GiB, files on disk {last[TIERED]['disk'] / GiB:.2f} GiB",
        f"throughput ratio (budget / in RAM): {rate[TIERED] / rate[PLAIN]:.2f} (goal >= 0.5)",
        C.machine_note(),
    ]
    C.emit(args.markdown, [("tier: rows/s and RSS", ["table", "rows/s", "ratio", "max RSS GiB", "RSS growth GiB"],
                            rows_table, [False, True, True, True, True])], notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
