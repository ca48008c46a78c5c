"""A 50-million-row sparse table on one server: fill time, memory, and pull+push on the full table.

One ``python -m paramshard server`` subprocess (async, SGD, dim 8 by default).
The table is filled by pulling batches of new ids (``--chunk`` per request,
1M by default); progress is printed as it goes. Then pull+push of
``--batch`` (100k) random existing ids is timed on the full table, interleaved
with the same op on a small (1M-row) table held by the same server, so the
cost of size (cache and TLB misses in the id index and the row arrays) shows
as a ratio.

Bounded: it refuses to start when /proc/meminfo MemAvailable is below the
estimated peak, stops filling (and reports what it reached) when
MemAvailable falls under ``--min-free-gib`` or the fill passes
``--max-fill-seconds``, and tears the server down by PID in every case.

Ids are mix64(i ^ salt) for i = 0, 1, ... (a bijection), so random existing ids
are made again from random i without keeping 50M ids in this process.

    .venv/bin/python benchmarks/big_table.py [--rows 50000000] [--dim 8] [--markdown]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

GiB = 1 << 30
BIG, SMALL = "big", "small"
SALT = {BIG: np.uint64(0x1234567890ABCDEF), SMALL: np.uint64(0x0FEDCBA987654321)}
LR = 0.01


def ids_of(table: str, index: np.ndarray) -> np.ndarray:
    """Distinct pseudo-random ids (mix64 is a bijection on uint64)."""
    from paramshard.placement.sparse_hash import mix64
    return mix64(index.astype(np.uint64) ^ SALT[table])



def estimate_bytes(rows: int, dim: int) -> tuple[int, int]:
    """(final, peak) bytes of an SGD table of ``rows`` rows, from SparseTable's layout:
    values + uint32 step counters with up to 1.25x capacity, an id index of 12 B per bucket
    (power of two, at most 3/4 full); at the peak, a growing array and its copy coexist."""
    buckets = 1 << int(np.ceil(np.log2(rows / 0.75)))
    rows_part = (dim * 4 + 4) * rows * 1.25
    final = rows_part + 12 * buckets
    peak = final + rows_part + 12 * buckets / 2 + 2 * GiB      # growth copy + old index + transients
    return int(final), int(peak)


def fill(client, proc, table: str, rows: int, dim: int, chunk: int, deadline: float, min_free: int,
         progress_every: int, log=print) -> dict:
    t0 = time.perf_counter()
    done, next_report, worst = 0, progress_every, 0.0
    stopped = None
    while done < rows:
        n = min(chunk, rows - done)
        ids = ids_of(table, np.arange(done, done + n))
        t = time.perf_counter()
        client.pull_sparse(table, ids, dim)
        worst = max(worst, time.perf_counter() - t)
        done += n
        if done >= next_report or done == rows:
            el = time.perf_counter() - t0
            st = C.proc_status(proc.pid)
            log(f"  {table}: {done:,} rows in {el:.1f} s ({done / el / 1e6:.2f}M rows/s), server RSS "
                f"{st['VmRSS'] / GiB:.2f} GiB, MemAvailable {C.mem_available() / GiB:.1f} GiB")
            next_report += progress_every
        if done < rows:
            if C.mem_available() < min_free:
                stopped = f"MemAvailable fell below {min_free / GiB:.1f} GiB"
            elif time.monotonic() > deadline:
                stopped = "the fill time limit was reached"
            if stopped:
                log(f"  stopping the fill at {done:,} rows: {stopped}")
                break
    return {"rows": done, "seconds": time.perf_counter() - t0, "worst_request_s": worst, "stopped": stopped}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=50_000_000)
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--chunk", type=int, default=1_000_000, help="new ids per fill request")
    p.add_argument("--batch", type=int, default=100_000, help="ids per timed pull+push")
    p.add_argument("--small-rows", type=int, default=1_000_000, help="rows of the small comparison table")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--max-fill-seconds", type=float, default=240.0)
    p.add_argument("--min-free-gib", type=float, default=2.0)
    p.add_argument("--markdown", action="store_true", help="print markdown tables for RESULTS.md")
    args = p.parse_args(argv)
    final_est, peak_est = estimate_bytes(args.rows, args.dim)
    avail = C.mem_available()
    if peak_est > avail:
        print(f"not starting: a {args.rows:,}-row table of dim {args.dim} needs about {peak_est / GiB:.1f} GiB "
              f"at its peak and {avail / GiB:.1f} GiB is available; lower --rows or --dim", file=sys.stderr)
        return 2
    C.install_sigterm_as_exit()
    note = C.machine_note()
    t_start = time.monotonic()
    from paramshard.client.sparse import SparseClient, TableSpec
    from paramshard.optim import SGD
    from paramshard.transport.client import ServerLinks
    children = C.Children()
    links = None
    try:
        addresses = C.start_paramshard_cluster(children, 1, 1, mode="async", timeout=120.0)
        proc = children.popen[-1][1]
        links = ServerLinks(addresses, timeout=180.0, who="bench")
        C.wait_servers(children, links)
        client = SparseClient(links, 0)
        rss0 = C.proc_status(proc.pid)["VmRSS"]
        print(f"server pid {proc.pid}; estimated table {final_est / GiB:.1f} GiB, peak {peak_est / GiB:.1f} GiB; "
              f"MemAvailable {avail / GiB:.1f} GiB", flush=True)
        for name in (SMALL, BIG):
            client.register_sparse(TableSpec(name, args.dim, SGD(lr=LR)))
        small = fill(client, proc, SMALL, args.small_rows, args.dim, args.chunk, time.monotonic() + 60,
                     int(args.min_free_gib * GiB), args.small_rows)
        rss_small = C.proc_status(proc.pid)["VmRSS"]
        print(f"filling {args.rows:,} rows of dim {args.dim}, {args.chunk:,} new ids per request ...", flush=True)
        big = fill(client, proc, BIG, args.rows, args.dim, args.chunk, time.monotonic() + args.max_fill_seconds,
                   int(args.min_free_gib * GiB), max(args.chunk, args.rows // 10))
        time.sleep(0.2)
        st = C.proc_status(proc.pid)
        stats = links.request(0, {"op": "stats"})[0]["stats"]["tables"]
        children.check_alive()

        print(f"timing pull+push of {args.batch:,} existing ids, big and small table interleaved ...", flush=True)
        rng = np.random.default_rng(7)
        grads = np.full((args.batch, args.dim), 1e-3, np.float32)
        times = {BIG: [], SMALL: []}
        filled = {BIG: big["rows"], SMALL: small["rows"]}
        pulled = {}
        for rep in range(args.reps + 2):
            for name in ((BIG, SMALL) if rep % 2 == 0 else (SMALL, BIG)):
                pick = np.unique(rng.integers(0, filled[name], args.batch + args.batch // 8))
                ids = ids_of(name, rng.permutation(pick)[:args.batch])     # distinct, random order
                g = grads[:len(ids)]
                t0 = time.perf_counter()
                pulled[name] = client.pull_sparse(name, ids, args.dim)
                t1 = time.perf_counter()
                client.push_sparse(name, ids, g, 0)
                t2 = time.perf_counter()
                if rep >= 2:                                  # two warm-up rounds
                    times[name].append((t1 - t0, t2 - t1))
        after_ops = links.request(0, {"op": "stats"})[0]["stats"]["tables"]
        if after_ops[BIG]["rows"] != stats[BIG]["rows"]:
            raise AssertionError("pulls of existing ids created rows: the ids were not the filled ones")
    finally:
        if links is not None:
            links.close()
        children.stop_all()

    rows_big = stats[BIG]["rows"]
    rss_table = st["VmRSS"] - rss_small
    res_headers = ["measure", "value"]
    res_rows = [
        ["rows filled (target)",
         f"{rows_big:,} ({args.rows:,})" + (f", stopped: {big['stopped']}" if big["stopped"] else "")],
        ["fill time", f"{big['seconds']:.1f} s ({rows_big / big['seconds'] / 1e6:.2f}M rows/s, "
                      f"{args.chunk:,} ids per request; slowest request {big['worst_request_s']:.1f} s)"],
        ["server bytes (stats) of the big table", f"{stats[BIG]['bytes'] / GiB:.2f} GiB = "
                                                  f"{stats[BIG]['bytes'] / rows_big:.1f} B/row"],
        ["server RSS growth for the big table", f"{rss_table / GiB:.2f} GiB = {rss_table / rows_big:.1f} B/row"],
        ["raw row size (dim * 4, SGD)",
         f"{args.dim * 4} B/row -> stats {stats[BIG]['bytes'] / rows_big / (args.dim * 4):.2f}x, "
         f"RSS {rss_table / rows_big / (args.dim * 4):.2f}x"],
        ["server RSS total / peak (VmHWM)", f"{st['VmRSS'] / GiB:.2f} / {st['VmHWM'] / GiB:.2f} GiB "
                                            f"(empty server: {rss0 / GiB:.2f} GiB)"],
    ]
    headers = ["table", "rows", "pull ms", "push ms", "pull+push ms", "p25-p75 ms", "rows/s", "ratio big/small"]
    right = [False, True, True, True, True, True, True, True]
    rows = []
    med = {k: C.median([a + b for a, b in v]) for k, v in times.items()}
    for name in (BIG, SMALL):
        q1, q3 = C.quartiles(sorted(a + b for a, b in times[name]))
        rows.append([name, f"{filled[name]:,}", f"{C.median([a for a, _ in times[name]]) * 1e3:.1f}",
                     f"{C.median([b for _, b in times[name]]) * 1e3:.1f}", f"{med[name] * 1e3:.1f}",
                     f"{q1 * 1e3:.1f}-{q3 * 1e3:.1f}", f"{args.batch / med[name] / 1e6:.2f}M",
                     f"{med[SMALL] / med[name]:.2f}x" if name == BIG else "1.00x"])
    note += (f"; load average {os.getloadavg()[0]:.2f} at end; {time.monotonic() - t_start:.0f} s; "
             f"dim {args.dim}, SGD, async, {args.reps} timed reps of {args.batch:,} random existing ids")
    if args.markdown:
        print(C.markdown_table(res_headers, res_rows, [False, False]))
        print()
        print(C.markdown_table(headers, rows, right))
        print()
        print(f"_{note}_")
    else:
        from rich.console import Console
        console = Console(width=max(Console().width, 120))
        console.print(C.rich_table(f"Big table: {rows_big:,} rows of dim {args.dim}", res_headers, res_rows,
                                   [False, False]))
        console.print(C.rich_table("pull+push on the full table vs a small table (same server)", headers, rows,
                                   right))
        console.print(note)
    return 0 if not big["stopped"] else 1


if __name__ == "__main__":
    sys.exit(main())
