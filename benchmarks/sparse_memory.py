"""Sparse-table memory per row on a server vs the row's raw size.

For SGD (0 optimizer slots), Adagrad (1) and Adam (2) at dim 8, 16 and 64, a
fresh ``python -m paramshard server`` subprocess gets one table filled with
``--rows`` rows (pulls of new ids create them). Two measures per table:

- the server's own statistics (``stats`` -> ``tables`` -> ``bytes``, ``rows``):
  the bytes of every array the table holds (capacity included);
- the server process's resident memory growth (``VmRSS`` in /proc/PID/status,
  after the fill minus before the table was registered), an independent check
  (pages a table reserved but never wrote do not count there), and the peak
  (``VmHWM``) during the fill.

Both are divided by the rows and compared with the raw row size
``dim * 4 * (1 + slots)`` bytes: the ratio is the overhead factor (target <= 1.5x).
An in-process ``SparseTable`` filled the same way splits the statistic into
its parts (values, slots, per-row step counter, id index, capacity slack).

    .venv/bin/python benchmarks/sparse_memory.py [--rows 1500000] [--dims 8,16,64] [--markdown]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

TABLE = "t"
OPTIMIZERS = (("SGD", 0), ("Adagrad", 1), ("Adam", 2))



def optimizer(name: str):
    from paramshard import optim
    return {"SGD": optim.SGD(lr=0.01), "Adagrad": optim.Adagrad(lr=0.05), "Adam": optim.Adam(lr=1e-3)}[name]


def chunks_of(rows: int, chunk: int, seed: int):
    rng = np.random.default_rng(seed)
    left = rows
    while left > 0:
        n = min(chunk, left)
        ids = np.unique(rng.integers(0, 2 ** 63, n + 64, dtype=np.uint64))[:n]
        yield ids[rng.permutation(len(ids))]
        left -= n


def measure_server(children: C.Children, opt: str, dim: int, rows: int, chunk: int,
                   fixed_mmap_threshold: bool = False) -> dict:
    """Fill a table on a fresh server subprocess. ``fixed_mmap_threshold`` starts the server with
    MALLOC_MMAP_THRESHOLD_=128 KiB: glibc then returns every freed array of >= 128 KiB to the OS
    instead of keeping freed heap (its default raises that threshold up to 32 MiB as arrays are freed)."""
    from paramshard.client.sparse import SparseClient, TableSpec
    from paramshard.transport.links import ServerLinks
    saved = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    if fixed_mmap_threshold:
        os.environ["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)
    else:
        os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
    try:
        addresses = C.start_paramshard_cluster(children, 1, 1, mode="async")
    finally:
        if saved is None:
            os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
        else:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = saved
    proc = children.popen[-1][1]
    links = ServerLinks(addresses, timeout=120.0, who="bench")
    try:
        C.wait_servers(children, links)
        client = SparseClient(links, 0)
        # warm-up on a tiny table first: lazy imports, first buffers and the like are not the table's
        client.register_sparse(TableSpec("warmup", dim, optimizer(opt)))
        warm = next(chunks_of(4096, 4096, seed=1)) | np.uint64(1 << 63)
        client.pull_sparse("warmup", warm, dim)
        client.push_sparse("warmup", warm, np.zeros((len(warm), dim), np.float32), 0)
        before = C.proc_status(proc.pid)
        client.register_sparse(TableSpec(TABLE, dim, optimizer(opt)))
        t0 = time.perf_counter()
        for ids in chunks_of(rows, chunk, seed=dim * 10 + len(opt)):
            client.pull_sparse(TABLE, ids, dim)
        fill_s = time.perf_counter() - t0
        time.sleep(0.2)                       # let the last reply's buffer be released
        after = C.proc_status(proc.pid)
        stats = links.request(0, {"op": "stats"})[0]["stats"]["tables"][TABLE]
    finally:
        links.close()
        children.stop_all()
    return {"rows": stats["rows"], "bytes": stats["bytes"], "rss_growth": after["VmRSS"] - before["VmRSS"],
            "peak_growth": after["VmHWM"] - before["VmRSS"], "fill_s": fill_s}


def measure_parts(opt: str, dim: int, rows: int, chunk: int) -> dict:
    """The same fill on an in-process SparseTable, split into its arrays."""
    from paramshard.server.core.barrier import Membership
    from paramshard.server.storage.sparse_table import SparseTable
    from paramshard.tables import Admission, Eviction
    table = SparseTable(TABLE, dim, 0, optimizer(opt), Admission(), Eviction(), 0.01, "async", Membership(1, grace=60.0))
    for ids in chunks_of(rows, chunk, seed=dim * 10 + len(opt)):
        table.rows_for(ids, create=True)      # creates rows exactly as pull does, without the reply
    n = table.num_rows
    parts = {"values": table.values.nbytes, "slots": sum(s.nbytes for s in table.slots),
             "steps": table.steps.nbytes if table.steps is not None else 0, "index": table.index.nbytes}
    out = {k: v / n for k, v in parts.items()}
    out["capacity"] = len(table.values) / n
    out["buckets"] = len(table.index.buckets) / n
    out["total"] = table.nbytes / n
    del table
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_500_000)
    p.add_argument("--dims", default="8,16,64")
    p.add_argument("--chunk", type=int, default=250_000, help="new ids per pull while filling")
    p.add_argument("--no-malloc-check", action="store_true",
                   help="skip the second fill with MALLOC_MMAP_THRESHOLD_ fixed at 128 KiB (quicker)")
    p.add_argument("--no-parts", action="store_true", help="skip the in-process breakdown (quicker)")
    p.add_argument("--markdown", action="store_true", help="print markdown tables for RESULTS.md")
    args = p.parse_args(argv)
    dims = [int(d) for d in args.dims.split(",") if d.strip()]
    need = max(dims) * 4 * 3 * args.rows * 3
    avail = _mem_available()
    if avail is not None and need > avail:
        p.error(f"about {need / 2 ** 30:.1f} GiB could be needed at the peak, {avail / 2 ** 30:.1f} GiB is "
                f"available: lower --rows or --dims")
    C.install_sigterm_as_exit()
    note = C.machine_note()
    children = C.Children()
    t_start = time.monotonic()
    results = []
    try:
        for dim in dims:
            for opt, slots in OPTIMIZERS:
                print(f"{opt} dim {dim}: filling {args.rows:,} rows ...", flush=True)
                r = measure_server(children, opt, dim, args.rows, args.chunk)
                r.update(opt=opt, slots=slots, dim=dim, raw=dim * 4 * (1 + slots))
                if not args.no_malloc_check:
                    r["fixed"] = measure_server(children, opt, dim, args.rows, args.chunk, True)
                if not args.no_parts:
                    r["parts"] = measure_parts(opt, dim, args.rows, args.chunk)
                results.append(r)
    finally:
        children.stop_all()
    note += f"; load average {os.getloadavg()[0]:.2f} at end; {time.monotonic() - t_start:.0f} s"
    report(args, results, note)
    return 0


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def report(args, results, note: str) -> None:
    headers = ["optimizer", "dim", "rows", "raw B/row", "stats B/row", "stats / raw", "RSS growth B/row",
               "RSS / raw", "RSS B/row, fixed mmap threshold", "RSS / raw, fixed", "peak RSS growth B/row",
               "fill s"]
    right = [False] + [True] * 11
    rows = []
    for r in results:
        n = r["rows"]
        fixed = r.get("fixed")
        rows.append([r["opt"], str(r["dim"]), f"{n:,}", f"{r['raw']}", f"{r['bytes'] / n:.1f}",
                     f"{r['bytes'] / n / r['raw']:.2f}x", f"{r['rss_growth'] / n:.1f}",
                     f"{r['rss_growth'] / n / r['raw']:.2f}x",
                     f"{fixed['rss_growth'] / fixed['rows']:.1f}" if fixed else "-",
                     f"{fixed['rss_growth'] / fixed['rows'] / r['raw']:.2f}x" if fixed else "-",
                     f"{r['peak_growth'] / n:.1f}", f"{r['fill_s']:.1f}"])
    pheaders = ["optimizer", "dim", "values B/row", "slots B/row", "steps B/row", "index B/row",
                "row capacity / rows", "index buckets / rows", "total B/row"]
    prows = []
    for r in results:
        if "parts" not in r:
            continue
        q = r["parts"]
        prows.append([r["opt"], str(r["dim"]), f"{q['values']:.1f}", f"{q['slots']:.1f}", f"{q['steps']:.1f}",
                      f"{q['index']:.1f}", f"{q['capacity']:.3f}", f"{q['buckets']:.3f}", f"{q['total']:.1f}"])
    extra = (f"raw = dim * 4 * (1 + optimizer slots); stats = the server's own byte count of the table's "
             f"arrays (capacity included); RSS growth = server VmRSS after the fill minus before registering "
             f"the table, measured after a warm-up on a 4k-row table (glibc defaults); 'fixed mmap threshold' = the same fill on a server started with "
             f"MALLOC_MMAP_THRESHOLD_=131072, so freed arrays go back to the OS (what is left is table data, counted in whole 2 MiB "
             f"transparent huge pages where numpy asked for them); "
             f"peak = VmHWM minus the same start (defaults). Fill: pulls of {args.chunk:,} new ids. "
             f"Target: <= 1.5x.")
    tables = [("Sparse table memory per row", headers, rows, right)]
    if prows:
        tables.append(("Where the bytes go (in-process SparseTable, same fill)", pheaders, prows,
                       [False] + [True] * 8))
    C.emit(args.markdown, tables, [extra, note])


if __name__ == "__main__":
    sys.exit(main())
