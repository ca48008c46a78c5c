"""Row stores side by side: the store-level measures of the compiled-store issue (issue 22).

Every store named by ``--stores`` (default: every store of
``paramshard.server.storage.row_stores.STORES``; without that module, the numpy store
alone) holds the rows of an in-process ``SparseTable`` (async, 1 trainer, dim
``--dim``, default Admission/Eviction, init scale 0.01); no servers, no
network. The measures, each its own function (``--only``):

1. first_touch: ``SparseTable.pull`` of batches of ``--batch`` fresh ids
   (create, Adagrad lr 0.05) until ``--rows`` rows exist: rows created per second,
   the making of their initial rows included.
2. gather: ``SparseTable.pull`` of ``--ids`` existing ids drawn Zipf(s=1) over the
   ``--rows`` rows of a table (log-uniform ranks, the hot rows spread at random,
   so ids repeat as in a CTR batch): requested ids per second, the pull alone.
3. pull_push: ``pull`` then ``push`` (distinct=True, float32 [n, dim] gradients)
   of ``--ids`` distinct uniform random existing ids, async, on a ``--rows``-row
   table: rows per second, for SGD, Adagrad, Adam (and RowWiseAdagrad when
   ``paramshard.optim`` has it).
4. embeddingbag: the same op as an in-process ``nn.EmbeddingBag(rows, dim,
   mode="sum", sparse=True)`` forward + backward + optimizer step (SGD, Adagrad,
   SparseAdam; Adagrad for RowWiseAdagrad, torch has no row-wise one) over the
   same row positions: the peer of every store. With pull_push, it runs in the
   same interleaved rounds.
5. growth: a table without reserved capacity (capacity=1024) filled by pulls of
   ``--growth-batch`` fresh ids up to ``--rows``: the duration of every request;
   the longest, p99 and median.
6. bytes_per_row: ``store.nbytes / num_rows`` and the VmRSS growth per row while
   filling ``--rows`` rows in a fresh spawned process per store and optimizer
   (Adagrad, RowWiseAdagrad if present, SGD), so stores share no heap.
7. size_ratio: pull+push rate of ``--ids`` ids on a ``--big-rows`` table divided by
   the rate on a ``--small-rows`` table, the two interleaved (one store at a time,
   so one big table is alive at once). Refuses to start when MemAvailable is
   below twice the estimated bytes.

Tables are made with ``capacity=`` their final rows except in growth. Rounds are
interleaved: round r runs every store (and the peer) once, in a rotated order,
before round r+1; figures are medians of ``--repeats`` rounds, ratios are of
medians. Each store and optimizer is warmed up on a tiny table first (imports,
JIT compilation).

    .venv/bin/python benchmarks/row_store.py [--stores numpy,compiled] [--only gather,growth]
        [--rows 4000000] [--repeats 5] [--quick] [--markdown]
"""
from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import time
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

GiB = 1 << 30
EBAG = "EmbeddingBag"
SALT = np.uint64(0x5DEECE66D2545F49)
LR = {"sgd": 0.05, "adagrad": 0.05, "adam": 1e-3, "rowwise_adagrad": 0.05}
MEASURES = ("first_touch", "gather", "pull_push", "embeddingbag", "growth", "bytes_per_row", "size_ratio")
QUICK = {"rows": 100_000, "batch": 25_000, "ids": 10_000, "growth_batch": 10_000, "big_rows": 500_000,
         "small_rows": 50_000, "repeats": 1}
DEFAULTS = {"rows": 4_000_000, "batch": 1_000_000, "ids": 100_000, "growth_batch": 100_000,
            "big_rows": 20_000_000, "small_rows": 1_000_000, "repeats": 5}
MIN_FREE = 1 * GiB          # a fill stops (an error) when MemAvailable falls below this


# -- stores, optimizers, tables ------------------------------------------------------------
def available_stores() -> tuple[dict[str, Callable], str]:
    """(name -> store factory, where the names came from)."""
    try:
        from paramshard.server.storage.row_stores import STORES
    except ImportError as exc:
        from paramshard.server.storage.numpy_row_store import NumpyRowStore
        return {"numpy": NumpyRowStore}, f"numpy only (paramshard.server.storage.row_stores: {exc})"
    return dict(STORES), "paramshard.server.storage.row_stores.STORES"


def optimizer_kinds() -> tuple[str, ...]:
    """The pull_push optimizers: rowwise_adagrad only when paramshard.optim has it."""
    from paramshard import optim
    return ("sgd", "adagrad", "adam") + (("rowwise_adagrad",) if hasattr(optim, "RowWiseAdagrad") else ())


def optimizer(kind: str):
    from paramshard import optim
    cls = {"sgd": optim.SGD, "adagrad": optim.Adagrad, "adam": optim.Adam,
           "rowwise_adagrad": getattr(optim, "RowWiseAdagrad", None)}[kind]
    return cls(lr=LR[kind])


def make_table(factory: Callable, kind: str, dim: int, capacity: int):
    from paramshard.server.core.barrier import Membership
    from paramshard.server.storage.sparse_table import SparseTable
    from paramshard.tables import Admission, Eviction
    return SparseTable("t", dim, 0, optimizer(kind), Admission(), Eviction(), 0.01, "async",
                       Membership(1, grace=60.0), capacity=capacity, store=factory)


def ids_of(index: np.ndarray) -> np.ndarray:
    """Distinct pseudo-random ids of row positions (mix64 is a bijection on uint64), so a
    table's ids are made again from positions instead of being kept."""
    from paramshard.placement.sparse_hash import mix64
    return mix64(index.astype(np.uint64) ^ SALT)


def fill(table, rows: int, batch: int) -> None:
    """Create rows for positions table.num_rows..rows-1 (rows_for: a pull without its reply)."""
    start = table.num_rows
    while start < rows:
        end = min(rows, start + batch)
        table.rows_for(ids_of(np.arange(start, end)), create=True)
        start = end
        if start < rows and C.mem_available() < MIN_FREE:
            raise MemoryError(f"MemAvailable fell below {MIN_FREE / GiB:.0f} GiB while filling "
                              f"{rows:,} rows (at {start:,})")


_warm: set = set()


def warm_up(name: str, factory: Callable, kind: str, dim: int) -> None:
    """A tiny table of this store and optimizer, pulled and pushed: imports and JIT compilation
    happen here, not in a timed op. Once per (store, optimizer, dim) and process."""
    if (name, kind, dim) in _warm:
        return
    table = make_table(factory, kind, dim, capacity=1024)
    for start in (0, 4096):            # past capacity 1024: the growth path is warmed up too
        ids = ids_of(np.arange(start, start + 4096) + (1 << 40))
        table.pull(ids, trainer=0)
        table.push(0, table.version, ids, np.full((len(ids), dim), 1e-3, np.float32), distinct=True)
        table.pull(ids[::3])
    _warm.add((name, kind, dim))


def rotated(names: list, r: int) -> list:
    k = r % len(names) if names else 0
    return names[k:] + names[:k]


def zipf_positions(rng, rows: int, n: int, perm: np.ndarray) -> np.ndarray:
    """n row positions, Zipf(s=1) by rank (log-uniform ranks 1..rows), rank k at perm[k-1]."""
    ranks = np.exp(rng.random(n) * math.log(rows)).astype(np.int64)     # 1 <= rank < rows
    return perm[np.minimum(ranks, rows) - 1]


def uniform_positions(rng, rows: int, n: int) -> np.ndarray:
    """n distinct row positions, uniform, in random order."""
    return rng.choice(rows, size=min(n, rows), replace=False, shuffle=True)


# -- 1. first touch ------------------------------------------------------------------------
def first_touch(stores: dict, o) -> dict[str, list[float]]:
    """Rows created per second by pulls of ``o.batch`` fresh ids up to ``o.rows`` rows."""
    for name, f in stores.items():
        warm_up(name, f, "adagrad", o.dim)
    batches = [ids_of(np.arange(s, min(o.rows, s + o.batch))) for s in range(0, o.rows, o.batch)]
    out = {name: [] for name in stores}
    for r in range(o.repeats):
        for name in rotated(list(stores), r):
            table = make_table(stores[name], "adagrad", o.dim, capacity=o.rows)
            t0 = time.perf_counter()
            for ids in batches:
                table.pull(ids)
            seconds = time.perf_counter() - t0
            assert table.num_rows == o.rows, (name, table.num_rows)
            out[name].append(o.rows / seconds)
            del table
            gc.collect()
    return out


# -- 2. gather -----------------------------------------------------------------------------
def gather(stores: dict, o) -> dict[str, list[float]]:
    """Requested ids per second of pulls of ``o.ids`` existing ids, Zipf(s=1) over the rows."""
    rng = np.random.default_rng(2)
    perm = rng.permutation(o.rows)
    tables = {}
    for name, f in stores.items():
        warm_up(name, f, "adagrad", o.dim)
        tables[name] = make_table(f, "adagrad", o.dim, capacity=o.rows)
        fill(tables[name], o.rows, o.batch)
    draws = [ids_of(zipf_positions(rng, o.rows, o.ids, perm)) for _ in range(o.repeats + 1)]
    out = {name: [] for name in stores}
    for r in range(o.repeats + 1):          # round 0: warm-up, untimed
        for name in rotated(list(stores), r):
            table = tables[name]
            t0 = time.perf_counter()
            table.pull(draws[r])
            seconds = time.perf_counter() - t0
            if r:
                out[name].append(len(draws[r]) / seconds)
    for table in tables.values():
        assert table.num_rows == o.rows
    return out


def zipf_distinct(o) -> float:
    """The share of distinct ids in a gather draw (one draw, as gather makes them)."""
    rng = np.random.default_rng(2)
    d = zipf_positions(rng, o.rows, o.ids, rng.permutation(o.rows))
    return len(np.unique(d)) / len(d)


# -- 3 and 4. pull+push, and the EmbeddingBag peer --------------------------------------------
class StoreCandidate:
    def __init__(self, name: str, factory: Callable, kind: str, o):
        warm_up(name, factory, kind, o.dim)
        self.table = make_table(factory, kind, o.dim, capacity=o.rows)
        fill(self.table, o.rows, o.batch)

    def run(self, positions: np.ndarray, ids: np.ndarray, grads: np.ndarray) -> float:
        table = self.table
        t0 = time.perf_counter()
        table.pull(ids, trainer=0)
        table.push(0, table.version, ids, grads, distinct=True)
        return time.perf_counter() - t0


class EbagCandidate:
    """nn.EmbeddingBag forward over bags of 1, backward of the same gradient, optimizer step."""

    def __init__(self, kind: str, o):
        import warnings

        import torch
        # torch.optim.Adagrad on sparse gradients says this on every step
        warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
        self.torch = torch
        self.bag = torch.nn.EmbeddingBag(o.rows, o.dim, mode="sum", sparse=True)
        params = list(self.bag.parameters())
        self.opt = {"sgd": lambda: torch.optim.SGD(params, lr=LR["sgd"]),
                    "adagrad": lambda: torch.optim.Adagrad(params, lr=LR["adagrad"]),
                    "rowwise_adagrad": lambda: torch.optim.Adagrad(params, lr=LR["rowwise_adagrad"]),
                    "adam": lambda: torch.optim.SparseAdam(params, lr=LR["adam"])}[kind]()

    def run(self, positions: np.ndarray, ids: np.ndarray, grads: np.ndarray) -> float:
        torch = self.torch
        idx = torch.from_numpy(positions.astype(np.int64))
        offsets = torch.arange(len(idx))
        g = torch.from_numpy(grads)
        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        self.bag(idx, offsets).backward(g)
        self.opt.step()
        return time.perf_counter() - t0


def ebag_optimizer(kind: str) -> str:
    return {"sgd": "SGD", "adagrad": "Adagrad", "adam": "SparseAdam",
            "rowwise_adagrad": "Adagrad (torch has no row-wise)"}[kind]


def pull_push(stores: dict, o, peer: bool = False, kinds: tuple[str, ...] | None = None
              ) -> dict[str, dict[str, list[float]]]:
    """{optimizer: {store (and EBAG with ``peer``): rows/s of pull+push of ``o.ids`` distinct ids}}.
    One optimizer at a time; within it, every candidate once per round."""
    if peer:
        import torch
        torch.set_num_threads(o.threads)
    out = {}
    for kind in kinds or optimizer_kinds():
        cands = {name: StoreCandidate(name, f, kind, o) for name, f in stores.items()}
        if peer:
            cands[EBAG] = EbagCandidate(kind, o)
        rng = np.random.default_rng(3)
        grads = (rng.standard_normal((min(o.ids, o.rows), o.dim)) * 1e-3).astype(np.float32)
        res = {name: [] for name in cands}
        for r in range(o.repeats + 1):      # round 0: warm-up (torch makes its state lazily), untimed
            positions = uniform_positions(rng, o.rows, o.ids)
            ids = ids_of(positions)
            for name in rotated(list(cands), r):
                seconds = cands[name].run(positions, ids, grads)
                if r:
                    res[name].append(len(ids) / seconds)
        out[kind] = res
        del cands
        gc.collect()
    return out


def embeddingbag(stores: dict, o, kinds: tuple[str, ...] | None = None) -> dict[str, dict[str, list[float]]]:
    """The peer alone: {optimizer: {EBAG: rows/s}} (main runs it inside pull_push when both are asked)."""
    return pull_push({}, o, peer=True, kinds=kinds)


# -- 5. growth -----------------------------------------------------------------------------
def growth(stores: dict, o) -> dict[str, list[list[float]]]:
    """{store: [[seconds of each request] per round]}: pulls of ``o.growth_batch`` fresh ids into a
    table made with capacity=1024, up to ``o.rows`` rows."""
    for name, f in stores.items():
        warm_up(name, f, "adagrad", o.dim)
    batches = [ids_of(np.arange(s, min(o.rows, s + o.growth_batch))) for s in range(0, o.rows, o.growth_batch)]
    out = {name: [] for name in stores}
    for r in range(o.repeats):
        for name in rotated(list(stores), r):
            table = make_table(stores[name], "adagrad", o.dim, capacity=1024)
            durations = []
            for ids in batches:
                t0 = time.perf_counter()
                table.pull(ids)
                durations.append(time.perf_counter() - t0)
            assert table.num_rows == o.rows
            out[name].append(durations)
            del table
            gc.collect()
    return out


def growth_summary(durations: list[float]) -> dict[str, float]:
    d = np.asarray(durations)
    return {"max": float(d.max()), "p99": float(np.percentile(d, 99)), "median": float(np.median(d)),
            "total": float(d.sum())}


# -- 6. bytes per row ----------------------------------------------------------------------
def _bytes_child(conn, store: str, kind: str, dim: int, rows: int, batch: int) -> None:
    """In a fresh spawned process: fill one table, answer its bytes and this process's RSS growth."""
    try:
        stores, _ = available_stores()
        warm_up(store, stores[store], kind, dim)
        gc.collect()
        before = C.proc_status(os.getpid())
        table = make_table(stores[store], kind, dim, capacity=rows)
        fill(table, rows, batch)
        gc.collect()
        after = C.proc_status(os.getpid())
        conn.send({"rows": table.num_rows, "nbytes": table.nbytes,
                   "rss": after["VmRSS"] - before["VmRSS"], "peak": after["VmHWM"] - before["VmRSS"]})
    except BaseException as exc:         # the parent reports it
        conn.send({"error": f"{type(exc).__name__}: {exc}"})


def bytes_kinds() -> tuple[str, ...]:
    return ("adagrad",) + (("rowwise_adagrad",) if "rowwise_adagrad" in optimizer_kinds() else ()) + ("sgd",)


def bytes_per_row(stores: dict, o, kinds: tuple[str, ...] | None = None) -> dict[str, dict[str, list[dict]]]:
    """{optimizer: {store: [{bytes_per_row, rss_per_row, peak_per_row} per round]}}, each figure
    from its own spawned process (one at a time, each waited on with ``o.timeout``)."""
    out = {}
    for kind in kinds or bytes_kinds():
        res = {name: [] for name in stores}
        for r in range(o.repeats):
            for name in rotated(list(stores), r):
                children = C.Children()
                try:
                    conn = children.start_mp(f"bytes_per_row {name} {kind}", _bytes_child,
                                             (name, kind, o.dim, o.rows, o.batch))
                    got = C.recv_with_timeout(conn, o.timeout, f"the {name} {kind} fill child")
                finally:
                    children.stop_all()
                if "error" in got:
                    raise RuntimeError(f"bytes_per_row {name} {kind}: {got['error']}")
                n = got["rows"]
                res[name].append({"bytes_per_row": got["nbytes"] / n, "rss_per_row": got["rss"] / n,
                                  "peak_per_row": got["peak"] / n})
        out[kind] = res
    return out


def raw_bytes(kind: str, dim: int) -> int:
    """Values and the rule's state of one row, as a fresh 1-row state says (float32)."""
    from paramshard.update_rules import make_rule
    slots = make_rule(optimizer(kind)).init_slots((1, dim))
    return dim * 4 + sum(s.nbytes for s in slots)


# -- 7. size ratio ---------------------------------------------------------------------------
SIZE_KIND = "adagrad"


def estimate_bytes(rows: int, dim: int, kind: str = SIZE_KIND) -> int:
    """Bytes of a table of ``rows`` rows laid out as the numpy store lays it: values, state,
    step counts, 8 B ids and int32 buckets (a power of two, at most 3/4 full)."""
    from paramshard.update_rules import make_rule
    buckets = 1 << max(4, math.ceil(math.log2(rows / 0.75)))
    steps = 4 if make_rule(optimizer(kind)).uses_step else 0
    return int(rows * (raw_bytes(kind, dim) + steps + 8) + 4 * buckets)


def size_ratio_need(o) -> tuple[int, int]:
    """(estimated bytes of the big and the small table alive together, MemAvailable)."""
    return estimate_bytes(o.big_rows, o.dim) + estimate_bytes(o.small_rows, o.dim), C.mem_available()


def size_ratio(stores: dict, o) -> dict[str, dict[str, list[float]]]:
    """{store: {"big": [rows/s], "small": [rows/s]}}: pull+push of ``o.ids`` distinct ids, the big
    (``o.big_rows``) and small (``o.small_rows``) table of one store interleaved, store after store."""
    need, avail = size_ratio_need(o)
    if avail < 2 * need:
        raise MemoryError(f"size_ratio: the tables need about {need / GiB:.1f} GiB, twice that is not "
                          f"available ({avail / GiB:.1f} GiB)")
    out = {}
    for name, f in stores.items():
        warm_up(name, f, SIZE_KIND, o.dim)
        tables = {"small": make_table(f, SIZE_KIND, o.dim, capacity=o.small_rows),
                  "big": make_table(f, SIZE_KIND, o.dim, capacity=o.big_rows)}
        size = {"small": o.small_rows, "big": o.big_rows}
        for which, table in tables.items():
            fill(table, size[which], o.batch)
        rng = np.random.default_rng(4)
        grads = (rng.standard_normal((min(o.ids, o.small_rows), o.dim)) * 1e-3).astype(np.float32)
        res = {"big": [], "small": []}
        for r in range(o.repeats + 1):      # round 0: warm-up
            for which in (("big", "small") if r % 2 == 0 else ("small", "big")):
                table = tables[which]
                ids = ids_of(uniform_positions(rng, size[which], o.ids))
                t0 = time.perf_counter()
                table.pull(ids, trainer=0)
                table.push(0, table.version, ids, grads[:len(ids)], distinct=True)
                seconds = time.perf_counter() - t0
                if r:
                    res[which].append(len(ids) / seconds)
        out[name] = res
        del tables
        gc.collect()
    return out


# -- report ----------------------------------------------------------------------------------
def _rate(x: float) -> str:
    return f"{x / 1e6:.2f}M"


def _ratio(num: float | None, den: float | None) -> str:
    return f"{num / den:.2f}x" if num and den else "-"


def _spread(xs: list[float]) -> str:
    q1, q3 = C.quartiles(sorted(xs))
    return f"{q1 / 1e6:.2f}-{q3 / 1e6:.2f}M"


def report(o, results: dict, notes: list[str]) -> None:
    tables = []
    headers = ["measure", "optimizer", "candidate", "rows/s", "p25-p75", "vs numpy", "vs EmbeddingBag"]
    rows = []

    def rate_rows(measure: str, kind: str, res: dict[str, list[float]]):
        med = {k: C.median(v) for k, v in res.items()}
        for name, v in res.items():
            vs_numpy = _ratio(med[name], med.get("numpy")) if name != EBAG else "-"
            vs_ebag = _ratio(med[name], med.get(EBAG)) if name != EBAG else "1.00x"
            label = f"{EBAG} + {ebag_optimizer(kind)}" if name == EBAG else name
            rows.append(["embeddingbag" if name == EBAG else measure, kind, label, _rate(med[name]), _spread(v),
                         vs_numpy, vs_ebag])

    if "first_touch" in results:
        rate_rows("first_touch", "adagrad", results["first_touch"])
    if "gather" in results:
        rate_rows("gather", "adagrad", results["gather"])
    for measure in ("pull_push", "embeddingbag"):
        for kind, res in results.get(measure, {}).items():
            rate_rows(measure, kind, res)
    if rows:
        tables.append(("Row stores: rates (medians of the rounds)", headers, rows,
                       [False, False, False, True, True, True, True]))

    if "growth" in results:
        gh = ["store", "requests", "longest ms", "p99 ms", "median ms", "fill rows/s", "longest vs numpy"]
        grows = []
        summ = {name: [growth_summary(d) for d in runs] for name, runs in results["growth"].items()}
        med = {name: {k: C.median([s[k] for s in ss]) for k in ("max", "p99", "median", "total")}
               for name, ss in summ.items()}
        for name, runs in results["growth"].items():
            m = med[name]
            grows.append([name, str(len(runs[0])), f"{m['max'] * 1e3:.1f}", f"{m['p99'] * 1e3:.1f}",
                          f"{m['median'] * 1e3:.1f}", _rate(o.rows / m["total"]),
                          _ratio(m["max"], med.get("numpy", {}).get("max"))])
        tables.append((f"Growth: {o.rows:,} rows from capacity 1024, {o.growth_batch:,} fresh ids per pull",
                       gh, grows, [False] + [True] * 6))

    if "bytes_per_row" in results:
        bh = ["optimizer", "store", "raw B/row", "nbytes B/row", "nbytes / raw", "RSS growth B/row",
              "RSS / raw", "peak RSS growth B/row", "RSS vs numpy"]
        brows = []
        for kind, res in results["bytes_per_row"].items():
            raw = raw_bytes(kind, o.dim)
            med = {name: {k: C.median([x[k] for x in runs]) for k in runs[0]} for name, runs in res.items()}
            for name, m in med.items():
                brows.append([kind, name, str(raw), f"{m['bytes_per_row']:.1f}", f"{m['bytes_per_row'] / raw:.2f}x",
                              f"{m['rss_per_row']:.1f}", f"{m['rss_per_row'] / raw:.2f}x",
                              f"{m['peak_per_row']:.1f}",
                              _ratio(m["rss_per_row"], med.get("numpy", {}).get("rss_per_row"))])
        tables.append((f"Bytes per row: {o.rows:,} rows, capacity reserved, a fresh process each",
                       bh, brows, [False, False] + [True] * 7))

    if "size_ratio" in results:
        sh = ["store", "big rows", "big rows/s", "small rows", "small rows/s", "big / small", "big vs numpy"]
        srows = []
        res = results["size_ratio"]
        big = {name: C.median(r["big"]) for name, r in res.items()}
        for name, r in res.items():
            small = C.median(r["small"])
            srows.append([name, f"{o.big_rows:,}", _rate(big[name]), f"{o.small_rows:,}", _rate(small),
                          _ratio(big[name], small), _ratio(big[name], big.get("numpy"))])
        tables.append((f"Size: pull+push of {o.ids:,} ids, {o.big_rows:,} vs {o.small_rows:,} rows ({SIZE_KIND})",
                       sh, srows, [False] + [True] * 6))
    C.emit(o.markdown, tables, notes)


def describe(o, results: dict) -> str:
    parts = [f"dim {o.dim}; rounds: {o.repeats}, interleaved (rotated order), medians; ratios of medians "
             f"(rates: store / numpy and store / EmbeddingBag, higher is faster)"]
    if "first_touch" in results:
        parts.append(f"first_touch: pulls of {o.batch:,} fresh ids up to {o.rows:,} rows, capacity reserved, "
                     f"Adagrad lr 0.05")
    if "gather" in results:
        parts.append(f"gather: pulls of {o.ids:,} ids drawn Zipf(s=1) over a {o.rows:,}-row table, "
                     f"{zipf_distinct(o):.0%} of them distinct; rows/s counts requested ids")
    if "pull_push" in results or "embeddingbag" in results:
        parts.append(f"pull_push: pull (trainer 0) + push (distinct=True) of {o.ids:,} distinct uniform ids "
                     f"of a {o.rows:,}-row table, async; lr: "
                     + ", ".join(f"{k} {LR[k]:g}" for k in optimizer_kinds()))
    if "embeddingbag" in o.only:
        parts.append(f"embeddingbag: EmbeddingBag({o.rows:,}, {o.dim}, sum, sparse) over the same row positions, "
                     f"forward+backward+step, in the same rounds as pull_push; torch threads {o.threads}")
    if "bytes_per_row" in results:
        parts.append("bytes_per_row: nbytes = the store's own count; RSS growth = VmRSS of a fresh spawned "
                     "process after the fill minus after a warm-up, per row; peak = VmHWM minus the same; "
                     "raw = values + the rule's state")
    if "size_ratio" in results:
        parts.append(f"size_ratio: {SIZE_KIND}, {o.ids:,} distinct uniform ids, big and small tables of one "
                     f"store alternated, one store at a time")
    return "; ".join(parts)


# -- driver ----------------------------------------------------------------------------------
def parse_args(argv=None, stores: dict | None = None) -> argparse.Namespace:
    names = list(stores if stores is not None else available_stores()[0])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stores", default=",".join(names), help=f"comma-separated, of: {','.join(names)}")
    p.add_argument("--only", default=",".join(MEASURES), help=f"comma-separated, of: {','.join(MEASURES)}")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--repeats", type=int, help=f"rounds (default {DEFAULTS['repeats']}, --quick {QUICK['repeats']})")
    p.add_argument("--rows", type=int, help=f"rows of the tables (default {DEFAULTS['rows']:,})")
    p.add_argument("--batch", type=int, help=f"fresh ids per first_touch pull and fill request "
                                             f"(default {DEFAULTS['batch']:,})")
    p.add_argument("--ids", type=int, help=f"ids per gather / pull+push (default {DEFAULTS['ids']:,})")
    p.add_argument("--growth-batch", type=int,
                   help=f"fresh ids per growth request (default {DEFAULTS['growth_batch']:,})")
    p.add_argument("--big-rows", type=int, help=f"size_ratio's big table (default {DEFAULTS['big_rows']:,})")
    p.add_argument("--small-rows", type=int, help=f"size_ratio's small table (default {DEFAULTS['small_rows']:,})")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads for the EmbeddingBag peer")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for each bytes_per_row child")
    p.add_argument("--quick", action="store_true", help="small sizes, 1 round: a smoke run")
    p.add_argument("--markdown", action="store_true", help="print markdown tables for RESULTS.md")
    o = p.parse_args(argv)
    sizes = QUICK if o.quick else DEFAULTS
    for k, v in sizes.items():
        if getattr(o, k) is None:
            setattr(o, k, v)
    o.stores = [s for s in o.stores.split(",") if s]
    o.only = [m for m in o.only.split(",") if m]
    bad = [s for s in o.stores if s not in names]
    if bad or not o.stores:
        p.error(f"--stores: {','.join(bad) or 'none given'}; the stores are {','.join(names)}")
    bad = [m for m in o.only if m not in MEASURES]
    if bad or not o.only:
        p.error(f"--only: {','.join(bad) or 'none given'}; the measures are {','.join(MEASURES)}")
    for k in ("dim", "repeats", "rows", "batch", "ids", "growth_batch", "big_rows", "small_rows", "threads"):
        if getattr(o, k) < 1:
            p.error(f"--{k.replace('_', '-')} must be >= 1")
    if o.ids > o.rows or o.ids > o.small_rows:
        p.error("--ids must be at most --rows and --small-rows")
    if "size_ratio" in o.only and o.big_rows <= o.small_rows:
        p.error("--big-rows must be more than --small-rows")
    return o


def run(o, stores: dict) -> dict:
    """Each selected measure in MEASURES order. With both pull_push and embeddingbag, the peer runs
    in pull_push's rounds and its rows appear there."""
    chosen = {name: stores[name] for name in o.stores}
    results = {}
    for m in MEASURES:
        if m not in o.only or (m == "embeddingbag" and "pull_push" in results):
            continue
        print(f"{m} ...", flush=True)
        t0 = time.monotonic()
        if m == "pull_push":
            results[m] = pull_push(chosen, o, peer="embeddingbag" in o.only)
        else:
            results[m] = globals()[m](chosen, o)
        print(f"{m}: {time.monotonic() - t0:.1f} s", flush=True)
    return results


def main(argv=None) -> int:
    stores, source = available_stores()
    o = parse_args(argv, stores)
    note = C.machine_note()
    print(note, flush=True)
    print(f"stores: {', '.join(o.stores)} (from {source}); measures: {', '.join(o.only)}", flush=True)
    if "size_ratio" in o.only:
        need, avail = size_ratio_need(o)
        if avail < 2 * need:
            print(f"not starting: size_ratio's tables ({o.big_rows:,} + {o.small_rows:,} rows of dim {o.dim}, "
                  f"{SIZE_KIND}) need about {need / GiB:.1f} GiB, MemAvailable is {avail / GiB:.1f} GiB, below "
                  f"twice that; lower --big-rows or leave size_ratio out of --only", file=sys.stderr)
            return 2
        print(f"size_ratio: estimated {need / GiB:.1f} GiB for its tables, MemAvailable {avail / GiB:.1f} GiB",
              flush=True)
    C.install_sigterm_as_exit()
    t_start = time.monotonic()
    results = run(o, stores)
    note += f"; load average {os.getloadavg()[0]:.2f} at end; {time.monotonic() - t_start:.0f} s"
    report(o, results, [describe(o, results), note])
    return 0


if __name__ == "__main__":
    sys.exit(main())
