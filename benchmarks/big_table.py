"""A 100-million-row sparse table over N servers, store by store: fill time, memory per server, pull+push.

``--servers`` (1) ``python -m paramshard server`` subprocesses (async; dim ``--dim``,
8 by default; ``--optimizer`` sgd, adagrad or rowwise_adagrad, sgd by default), their
rows held by the row store ``--store`` (PARAMSHARD_ROW_STORE in the servers'
environment; compiled by default). ``--stores compiled,numpy`` runs the whole
measurement once per store, one after the other (a store's servers are torn down
before the next store's start: one big table is alive at a time), and prints the
stores side by side with ratios to the first.

The client is paramshard's SparseClient: every id goes to the server
``sparse_hash.server_of`` names, and a request of n ids is one part per server, sent
together. The tables are registered without a capacity (no reserve: they grow as ids
come). The big table is filled by pulls of ``--chunk`` (1M) fresh ids per request;
progress is printed as it goes, and every request's duration is kept
(``--longest-request`` reports the longest, p99 and median: the growth stalls).
Then pull+push of ``--batch`` (100k) random existing ids is timed on the full table,
interleaved with the same op on a small (1M-row) table held by the same servers, so
the cost of size (cache and TLB misses in the id index and the row arrays) shows as
a ratio. Memory: VmRSS and VmHWM of each server process (by PID).

Bounded: before anything starts it prints each store's memory bound per server
(numpy: ``estimate_bytes``, the peak while its arrays grow; compiled:
``compiled_bound``) and refuses (exit 2) when a store's bound over all servers is
above /proc/meminfo MemAvailable. It stops filling (and reports what it reached) when
MemAvailable falls under ``--min-free-gib`` or the fill passes
``--max-fill-seconds``, and tears the servers down by PID in every case.

Ids are mix64(i ^ salt) for i = 0, 1, ... (a bijection), so random existing ids
are made again from random i without keeping 100M ids in this process.

    .venv/bin/python benchmarks/big_table.py [--rows 50000000] [--servers 2] [--stores compiled,numpy]
        [--dim 8] [--optimizer sgd] [--longest-request] [--estimate-only] [--markdown]
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
OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad")
STORES = ("compiled", "numpy")            # paramshard.server.storage.row_stores.STORES, checked in parse_args
COMPILED_INDEX_BYTES = 8 / 0.375          # a uint64 bucket per row, buckets at most 0.375 full after growing
COMPILED_MARGIN = 1 * GiB                 # per server: the interpreter, numba, transients
MEMORY_WAIT_S = 30.0                      # before the next store: for the last one's memory to come back


def ids_of(table: str, index: np.ndarray) -> np.ndarray:
    """Distinct pseudo-random ids (mix64 is a bijection on uint64)."""
    from paramshard.placement.sparse_hash import mix64
    return mix64(index.astype(np.uint64) ^ SALT[table])


def optimizer(kind: str):
    from paramshard.optim import KINDS
    return KINDS[kind](lr=LR)


def state_bytes(kind: str, dim: int) -> tuple[int, int]:
    """(optimizer slot bytes, step counter bytes) of one row, from the update rule's state of a fresh row."""
    from paramshard.update_rules import make_rule
    rule = make_rule(optimizer(kind))
    return sum(s.nbytes for s in rule.init_slots((1, dim))), (4 if rule.uses_step else 0)


# -- memory bounds ---------------------------------------------------------------------------
def estimate_bytes(rows: int, dim: int, slot_bytes: int = 0) -> tuple[int, int]:
    """(final, peak) bytes of a table of ``rows`` rows held by the numpy store: values,
    optimizer slots (``slot_bytes`` a row) and uint32 step counters with up to 1.25x
    capacity, an id index of 12 B per bucket (power of two, at most 3/4 full); at the
    peak, a growing array and its copy coexist."""
    buckets = 1 << int(np.ceil(np.log2(max(rows, 1) / 0.75)))
    rows_part = (dim * 4 + slot_bytes + 4) * rows * 1.25
    final = rows_part + 12 * buckets
    peak = final + rows_part + 12 * buckets / 2 + 2 * GiB      # growth copy + old index + transients
    return int(final), int(peak)


def compiled_row_bytes(dim: int, slot_bytes: int = 0, step_bytes: int = 0) -> float:
    """Bytes a row of the compiled store can take: its id (8), values, optimizer slots, step
    counter, and up to 8 / 0.375 bytes of uint64 buckets (right after the index doubled).
    While the old bucket array drains after a doubling (len(old) / 4 inserts) it adds up to
    8 / 0.75 bytes a row: the margin covers that up to ~100M rows a server."""
    return 8 + 4 * dim + slot_bytes + step_bytes + COMPILED_INDEX_BYTES


def compiled_bound(rows: int, dim: int, slot_bytes: int = 0, step_bytes: int = 0) -> int:
    """Bytes of a server holding ``rows`` rows in the compiled store, a margin included."""
    return int(rows * compiled_row_bytes(dim, slot_bytes, step_bytes)) + COMPILED_MARGIN


def rows_per_server(rows: int, servers: int) -> int:
    """The hash spreads ids evenly (the spread is ~sqrt(rows), negligible next to the margins)."""
    return -(-rows // servers)


def server_bound(store: str, rows: int, servers: int, dim: int, kind: str) -> int:
    """Bytes one of ``servers`` servers may need at most for its share of ``rows`` rows."""
    slots, steps = state_bytes(kind, dim)
    each = rows_per_server(rows, servers)
    if store == "numpy":
        return estimate_bytes(each, dim, slots)[1]
    if store == "compiled":
        return compiled_bound(each, dim, slots, steps)
    raise ValueError(f"no memory bound for the row store {store!r}")


def total_bound(store: str, rows: int, servers: int, dim: int, kind: str) -> int:
    return servers * server_bound(store, rows, servers, dim, kind)


def largest_rows(store: str, servers: int, dim: int, kind: str, available: int) -> int:
    """The largest --rows whose bound over all servers fits in ``available`` bytes (0: none)."""
    def fits(r: int) -> bool:
        return total_bound(store, r, servers, dim, kind) <= available
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while fits(hi):
        lo, hi = hi, hi * 2
        if hi > 1 << 48:
            return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def bound_lines(stores: list[str], rows: int, servers: int, dim: int, kind: str, available: int) -> list[str]:
    """What each store may need, per server and over all servers (printed before starting)."""
    slots, steps = state_bytes(kind, dim)
    each = rows_per_server(rows, servers)
    out = [f"memory bound for {rows:,} rows over {servers} server(s) ({each:,} each), dim {dim}, {kind}; "
           f"MemAvailable {available / GiB:.1f} GiB:"]
    for store in stores:
        per, total = server_bound(store, rows, servers, dim, kind), total_bound(store, rows, servers, dim, kind)
        if store == "numpy":
            final, _ = estimate_bytes(each, dim, slots)
            how = f"table {final / GiB:.2f} GiB, peak while growing (estimate_bytes)"
        else:
            parts = f"8 id + {4 * dim} values + {slots} slots" + (f" + {steps} steps" if steps else "")
            how = (f"{each:,} x {compiled_row_bytes(dim, slots, steps):.1f} B ({parts} + "
                   f"{COMPILED_INDEX_BYTES:.1f} index) + {COMPILED_MARGIN / GiB:.0f} GiB margin")
        out.append(f"  {store}: {how} = {per / GiB:.2f} GiB per server, {total / GiB:.2f} GiB in all"
                   + ("" if total <= available else " -- does not fit"))
    return out


def refusal(stores: list[str], rows: int, servers: int, dim: int, kind: str, available: int) -> str | None:
    """One line when some store's bound does not fit in ``available`` bytes (each store runs alone, so each
    must fit), naming the largest --rows that fits every store; None when all fit."""
    needs = {s: total_bound(s, rows, servers, dim, kind) for s in stores}
    if all(n <= available for n in needs.values()):
        return None
    largest = min(largest_rows(s, servers, dim, kind, available) for s in stores)
    need = ", ".join(f"{n / GiB:.1f} GiB ({s})" for s, n in needs.items())
    return (f"not starting: {rows:,} rows of dim {dim} ({kind}) over {servers} server(s) need about {need} and "
            f"MemAvailable is {available / GiB:.1f} GiB; the largest --rows that fits is {largest:,}")


def wait_for_memory(need: int, timeout: float) -> int:
    """MemAvailable once it reaches ``need`` (a torn-down server's pages come back), or at ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        avail = C.mem_available()
        if avail >= need or time.monotonic() > deadline:
            return avail
        time.sleep(0.5)


# -- one store ---------------------------------------------------------------------------
def statuses(pids: list[int]) -> list[dict[str, int]]:
    return [C.proc_status(pid) for pid in pids]


def fill(client, children, pids: list[int], table: str, rows: int, dim: int, chunk: int, deadline: float,
         min_free: int, progress_every: int, log=print) -> dict:
    """Pulls of ``chunk`` fresh ids until ``rows`` rows exist; every request's duration."""
    t0 = time.perf_counter()
    done, next_report, durations = 0, progress_every, []
    stopped = None
    while done < rows:
        n = min(chunk, rows - done)
        ids = ids_of(table, np.arange(done, done + n))
        t = time.perf_counter()
        client.pull_sparse(table, ids, dim)
        durations.append(time.perf_counter() - t)
        done += n
        if done >= next_report or done == rows:
            el = time.perf_counter() - t0
            rss = " + ".join(f"{st['VmRSS'] / GiB:.2f}" for st in statuses(pids))
            log(f"  {table}: {done:,} rows in {el:.1f} s ({done / el / 1e6:.2f}M rows/s), server RSS "
                f"{rss} GiB, MemAvailable {C.mem_available() / GiB:.1f} GiB", flush=True)
            next_report += progress_every
        if done < rows:
            children.check_alive()
            if C.mem_available() < min_free:
                stopped = f"MemAvailable fell below {min_free / GiB:.1f} GiB"
            elif time.monotonic() > deadline:
                stopped = "the fill time limit was reached"
            if stopped:
                log(f"  stopping the fill at {done:,} rows: {stopped}", flush=True)
                break
    return {"rows": done, "seconds": time.perf_counter() - t0, "durations": durations, "stopped": stopped}


def table_stats(links, servers: int) -> list[dict]:
    replies = links.request_many({s: ({"op": "stats"}, ()) for s in range(servers)})
    return [replies[s][0]["stats"]["tables"] for s in range(servers)]


def measure(store: str, args, log=print) -> dict:
    """The whole measurement on ``args.servers`` fresh servers holding their rows in ``store``."""
    from paramshard.client.sparse import SparseClient, TableSpec
    from paramshard.transport.links import ServerLinks
    n, min_free = args.servers, int(args.min_free_gib * GiB)
    children = C.Children()
    links = None
    try:
        addresses = C.start_paramshard_cluster(children, n, 1, mode="async", timeout=120.0,
                                               extra_env={"PARAMSHARD_ROW_STORE": store})
        pids = [proc.pid for _, proc, _ in children.popen]
        links = ServerLinks(addresses, timeout=180.0, who="bench")
        C.wait_servers(children, links)
        client = SparseClient(links, 0)
        rss0 = statuses(pids)
        log(f"{store} store: {n} server(s), pid {', '.join(map(str, pids))}", flush=True)
        for name in (SMALL, BIG):          # no capacity: nothing reserved, the tables grow as ids come
            client.register_sparse(TableSpec(name, args.dim, optimizer(args.optimizer)))
        small = fill(client, children, pids, SMALL, args.small_rows, args.dim, args.chunk, time.monotonic() + 60,
                     min_free, args.small_rows, log)
        rss_small = statuses(pids)
        log(f"filling {args.rows:,} rows of dim {args.dim} ({args.optimizer}), {args.chunk:,} new ids per "
            f"request ...", flush=True)
        big = fill(client, children, pids, BIG, args.rows, args.dim, args.chunk,
                   time.monotonic() + args.max_fill_seconds, min_free, max(args.chunk, args.rows // 10), log)
        time.sleep(0.2)
        filled_st = statuses(pids)
        stats = table_stats(links, n)
        children.check_alive()

        log(f"timing pull+push of {args.batch:,} existing ids, big and small table interleaved ...", flush=True)
        rng = np.random.default_rng(7)
        grads = np.full((args.batch, args.dim), 1e-3, np.float32)
        times = {BIG: [], SMALL: []}
        filled = {BIG: big["rows"], SMALL: small["rows"]}
        for rep in range(args.reps + 2):
            for name in ((BIG, SMALL) if rep % 2 == 0 else (SMALL, BIG)):
                pick = np.unique(rng.integers(0, filled[name], args.batch + args.batch // 8))
                ids = ids_of(name, rng.permutation(pick)[:args.batch])     # distinct, random order
                g = grads[:len(ids)]
                t0 = time.perf_counter()
                client.pull_sparse(name, ids, args.dim)
                t1 = time.perf_counter()
                client.push_sparse(name, ids, g, 0)
                t2 = time.perf_counter()
                if rep >= 2:                                  # two warm-up rounds
                    times[name].append((t1 - t0, t2 - t1))
        end_st = statuses(pids)
        after_ops = table_stats(links, n)
        if [t[BIG]["rows"] for t in after_ops] != [t[BIG]["rows"] for t in stats]:
            raise AssertionError("pulls of existing ids created rows: the ids were not the filled ones")
    finally:
        if links is not None:
            links.close()
        children.stop_all()
    return {"store": store, "pids": pids, "fill": big, "small_fill": small, "filled": filled, "times": times,
            "rows": [t[BIG]["rows"] for t in stats], "bytes": [t[BIG]["bytes"] for t in stats],
            "rss0": [s["VmRSS"] for s in rss0], "rss_small": [s["VmRSS"] for s in rss_small],
            "rss": [s["VmRSS"] for s in filled_st], "hwm": [s["VmHWM"] for s in end_st],
            "bound": server_bound(store, args.rows, n, args.dim, args.optimizer)}


# -- report ------------------------------------------------------------------------------
def request_summary(durations: list[float]) -> dict[str, float]:
    d = np.asarray(durations, np.float64)
    return {"longest": float(d.max()), "p99": float(np.percentile(d, 99)), "median": float(np.median(d)),
            "count": len(d)}


def side_by_side(results: dict[str, dict], args) -> tuple[list[str], list[list[str]], list[bool]]:
    """A row per measure, a column per store, then each later store's ratio to the first."""
    stores = list(results)
    first, others = stores[0], stores[1:]
    headers = ["measure", *stores, *(f"{o} / {first}" for o in others)]
    rows: list[list[str]] = []

    def add(label: str, cell) -> None:
        cells = {s: cell(r) for s, r in results.items()}       # (text, number for the ratio or None)
        row = [label] + [cells[s][0] for s in stores]
        for o in others:
            a, b = cells[o][1], cells[first][1]
            row.append(f"{a / b:.2f}x" if a is not None and b else "")
        rows.append(row)

    def total(r) -> int:
        return sum(r["rows"])

    def med(r, table) -> float:
        return C.median([a + b for a, b in r["times"][table]])

    slots, _ = state_bytes(args.optimizer, args.dim)
    raw = 4 * args.dim + slots
    add("rows filled (target)", lambda r: (f"{total(r):,} ({args.rows:,})"
                                           + (f", stopped: {r['fill']['stopped']}" if r["fill"]["stopped"] else ""),
                                           total(r)))
    add("rows per server", lambda r: (" / ".join(f"{x:,}" for x in r["rows"]), None))
    add("fill time", lambda r: (f"{r['fill']['seconds']:.1f} s ({total(r) / r['fill']['seconds'] / 1e6:.2f}M rows/s)",
                                r["fill"]["seconds"]))
    add("slowest fill request", lambda r: (f"{max(r['fill']['durations']) * 1e3:.0f} ms",
                                           max(r["fill"]["durations"])))
    if args.longest_request:
        add("fill requests", lambda r: (f"{len(r['fill']['durations']):,} of {args.chunk:,} fresh ids", None))
        for key in ("longest", "p99", "median"):
            add(f"fill request {key}", lambda r, key=key: (
                f"{request_summary(r['fill']['durations'])[key] * 1e3:.1f} ms",
                request_summary(r["fill"]["durations"])[key]))
    add("server bytes (stats), big table", lambda r: (f"{sum(r['bytes']) / GiB:.2f} GiB = "
                                                      f"{sum(r['bytes']) / total(r):.1f} B/row", sum(r["bytes"])))
    growth = lambda r: sum(a - b for a, b in zip(r["rss"], r["rss_small"]))      # noqa: E731
    add("server RSS growth for the big table",
        lambda r: (f"{growth(r) / GiB:.2f} GiB = {growth(r) / total(r):.1f} B/row", growth(r)))
    add(f"raw row size (dim * 4 + {args.optimizer} state)",
        lambda r: (f"{raw} B/row -> stats {sum(r['bytes']) / total(r) / raw:.2f}x, "
                   f"RSS {growth(r) / total(r) / raw:.2f}x", None))
    for s in range(args.servers):
        add(f"server {s} VmHWM (VmRSS after fill)",
            lambda r, s=s: (f"{r['hwm'][s] / GiB:.2f} GiB ({r['rss'][s] / GiB:.2f})", r["hwm"][s]))
    if args.servers > 1:
        add("all servers VmHWM (VmRSS after fill)",
            lambda r: (f"{sum(r['hwm']) / GiB:.2f} GiB ({sum(r['rss']) / GiB:.2f}; empty servers "
                       f"{sum(r['rss0']) / GiB:.2f})", sum(r["hwm"])))
    add("memory bound per server (largest VmHWM / bound)",
        lambda r: (f"{r['bound'] / GiB:.2f} GiB ({max(r['hwm']) / r['bound']:.2f})", r["bound"]))
    add(f"pull+push {args.batch:,} ids, big table", lambda r: (f"{med(r, BIG) * 1e3:.1f} ms "
                                                              f"({args.batch / med(r, BIG) / 1e6:.2f}M rows/s)",
                                                              med(r, BIG)))
    add(f"pull+push {args.batch:,} ids, small table", lambda r: (f"{med(r, SMALL) * 1e3:.1f} ms "
                                                                f"({args.batch / med(r, SMALL) / 1e6:.2f}M rows/s)",
                                                                med(r, SMALL)))
    add("rate big / small", lambda r: (f"{med(r, SMALL) / med(r, BIG):.2f}x", med(r, SMALL) / med(r, BIG)))
    return headers, rows, [False] + [True] * (len(headers) - 1)


def op_rows(results: dict[str, dict], args) -> tuple[list[str], list[list[str]], list[bool]]:
    headers = ["store", "table", "rows", "pull ms", "push ms", "pull+push ms", "p25-p75 ms", "rows/s",
               "ratio big/small"]
    rows = []
    for store, r in results.items():
        med = {k: C.median([a + b for a, b in v]) for k, v in r["times"].items()}
        for name in (BIG, SMALL):
            ts = r["times"][name]
            q1, q3 = C.quartiles(sorted(a + b for a, b in ts))
            rows.append([store, name, f"{r['filled'][name]:,}", f"{C.median([a for a, _ in ts]) * 1e3:.1f}",
                         f"{C.median([b for _, b in ts]) * 1e3:.1f}", f"{med[name] * 1e3:.1f}",
                         f"{q1 * 1e3:.1f}-{q3 * 1e3:.1f}", f"{args.batch / med[name] / 1e6:.2f}M",
                         f"{med[SMALL] / med[name]:.2f}x" if name == BIG else "1.00x"])
    return headers, rows, [False, False] + [True] * 7


def report(results: dict[str, dict], args, note: str) -> None:
    n = args.servers
    stores = list(results)
    title = (f"Big table: {args.rows:,} rows of dim {args.dim}, {args.optimizer}, over {n} server(s), "
             f"store{'s' if len(stores) > 1 else ''} {' vs '.join(stores)}")
    C.emit(args.markdown, [(title, *side_by_side(results, args)),
                           ("pull+push on the full table vs a small table (same servers)", *op_rows(results, args))],
           [note])


# -- main --------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=50_000_000, help="rows of the big table, over all servers")
    p.add_argument("--servers", type=int, default=1, help="server processes; ids go to them by sparse_hash")
    p.add_argument("--store", default="compiled", help="row store of the servers (PARAMSHARD_ROW_STORE)")
    p.add_argument("--stores", default=None,
                   help="comma-separated row stores, measured one after the other and shown side by side "
                        "(overrides --store)")
    p.add_argument("--optimizer", default="sgd", choices=OPTIMIZERS)
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--chunk", type=int, default=1_000_000, help="new ids per fill request")
    p.add_argument("--batch", type=int, default=100_000, help="ids per timed pull+push")
    p.add_argument("--small-rows", type=int, default=1_000_000, help="rows of the small comparison table")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--max-fill-seconds", type=float, default=240.0, help="per store")
    p.add_argument("--min-free-gib", type=float, default=2.0)
    p.add_argument("--longest-request", action="store_true",
                   help="report the longest, p99 and median fill request (growth without reserved capacity)")
    p.add_argument("--estimate-only", action="store_true",
                   help="print the memory bounds and the largest --rows that fits, start nothing")
    p.add_argument("--markdown", action="store_true", help="print markdown tables for RESULTS.md")
    args = p.parse_args(argv)
    args.store_list = [s.strip() for s in (args.stores if args.stores else args.store).split(",") if s.strip()]
    from paramshard.server.storage.row_stores import STORES as REGISTERED
    for s in args.store_list:
        if s not in REGISTERED or s not in STORES:
            p.error(f"unknown row store {s!r}: one of {', '.join(STORES)}")
    if len(set(args.store_list)) != len(args.store_list):
        p.error(f"--stores names a store twice: {args.stores}")
    for name in ("rows", "servers", "dim", "chunk", "batch", "small_rows", "reps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    stores = args.store_list
    avail = C.mem_available()
    for line in bound_lines(stores, args.rows, args.servers, args.dim, args.optimizer, avail):
        print(line, flush=True)
    refused = refusal(stores, args.rows, args.servers, args.dim, args.optimizer, avail)
    if args.estimate_only:
        print("largest --rows that fits: " + ", ".join(
            f"{largest_rows(s, args.servers, args.dim, args.optimizer, avail):,} ({s})" for s in stores))
        return 0
    if refused:
        print(refused, file=sys.stderr)
        return 2
    C.install_sigterm_as_exit()
    note = C.machine_note()
    t_start = time.monotonic()
    results: dict[str, dict] = {}
    code = 0
    for i, store in enumerate(stores):
        if i:     # the last store's servers are gone: wait (bounded) for their memory to come back
            need = total_bound(store, args.rows, args.servers, args.dim, args.optimizer)
            avail = wait_for_memory(need, MEMORY_WAIT_S)
            refused = refusal([store], args.rows, args.servers, args.dim, args.optimizer, avail)
            if refused:
                print(refused, file=sys.stderr)
                code = 2
                break
        results[store] = measure(store, args)
    if not results:
        return code
    note += (f"; load average {os.getloadavg()[0]:.2f} at end; {time.monotonic() - t_start:.0f} s; "
             f"{args.servers} server(s), dim {args.dim}, {args.optimizer}, async; no reserved capacity, "
             f"{args.chunk:,} fresh ids per fill request; {args.reps} timed reps of {args.batch:,} random "
             f"existing ids; stores one after the other")
    report(results, args, note)
    if code:
        return code
    return 1 if any(r["fill"]["stopped"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
