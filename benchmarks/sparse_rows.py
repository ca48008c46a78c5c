"""Sparse rows: pull+push of 100k distinct ids through paramshard vs torch.nn.EmbeddingBag.

One run, same machine, candidates interleaved per repetition (DESIGN section 8):

- paramshard async / sync: ``SparseClient.pull_sparse(ids)`` then
  ``push_sparse(ids, grads)`` of a gradient of the same shape, against one
  ``python -m paramshard server`` subprocess (1 trainer, SGD), rows of dim 16.
- EmbeddingBag: ``nn.EmbeddingBag(V, 16, mode="sum", sparse=True)`` forward
  over the same number of rows as bags of 1, ``backward`` of the same
  gradient, ``torch.optim.SGD`` step: the no-network limit.

Two cases, timed separately:
- steady: the table already holds ``--table-rows`` rows; every repetition uses
  a random ``--rows`` subset of them (the same subsets for every candidate).
- first touch: every repetition pulls ``--rows`` ids never seen before, so the
  server creates (index insert + deterministic init) every row. EmbeddingBag
  has no lazy rows: its peer there is the same step over rows of a region of
  its (pre-allocated, initialised at construction) table not used before.

Then a breakdown of the paramshard op (async server): client-side partition
and encode, the client's gather of the reply, each server-side phase timed on
an in-process ``SparseTable`` in the same state (id index lookup, row gather,
merge of duplicates, optimizer update), a raw pyzmq echo of the same bytes
(the transport floor), and what is left (messaging/framework overhead).

    .venv/bin/python benchmarks/sparse_rows.py [--rows 100000] [--reps 15] [--markdown]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

DIM = 16
LR = 0.01
TABLE = "emb"
PS_ASYNC, PS_SYNC, EBAG = "paramshard async", "paramshard sync", "EmbeddingBag+SGD"
CANDIDATES = (PS_ASYNC, PS_SYNC, EBAG)
STEADY, FIRST = "steady", "first touch"


# -- raw transport floor: a pyzmq echo child that answers with a reply of a given size ---------
def echo_server(conn, host: str) -> None:
    """ROUTER: request [payload..., reply_nbytes(8 bytes)] -> reply of that many bytes."""
    replies: dict[int, np.ndarray] = {}

    def answer(frames):
        n = int(np.frombuffer(frames[-1].buffer, np.int64)[0])
        if n not in replies:
            replies[n] = np.ones(max(n, 1), np.uint8)
        return [frames[0], memoryview(replies[n][:n])]

    C.serve_router(conn, host, answer)


class RawEcho:
    def __init__(self, children: C.Children):
        import zmq
        conn = children.start_mp("raw pyzmq echo", echo_server, (C.HOST,))
        port = C.recv_with_timeout(conn, 30, "the echo server")
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, 60_000)
        self.sock.setsockopt(zmq.SNDTIMEO, 60_000)
        self.sock.connect(f"tcp://{C.HOST}:{port}")

    def round_trip(self, arrays, reply_nbytes: int, out: np.ndarray | None = None) -> None:
        self.sock.send_multipart([*[memoryview(np.ascontiguousarray(a).reshape(-1)).cast("B") for a in arrays],
                                  np.array([reply_nbytes], np.int64)], copy=False)
        frame = self.sock.recv(copy=False)
        if out is not None:   # as a client must: the rows land in an array it owns
            np.copyto(out.reshape(-1).view(np.uint8), np.frombuffer(frame.buffer, np.uint8))
        del frame

    def close(self):
        self.sock.close(0)


# -- candidates ----------------------------------------------------------------------
class PsCandidate:
    def __init__(self, children: C.Children, mode: str, prefill: np.ndarray):
        from paramshard.client.sparse import SparseClient, TableSpec
        from paramshard.optim import SGD
        from paramshard.transport.links import ServerLinks
        self.mode = mode
        self.addresses = C.start_paramshard_cluster(children, 1, 1, mode=mode)
        self.links = ServerLinks(self.addresses, timeout=60.0, who="bench")
        C.wait_servers(children, self.links)
        self.client = SparseClient(self.links, trainer_id=0)
        self.client.register_sparse(TableSpec(TABLE, DIM, SGD(lr=LR)))
        self.step = 0
        for chunk in np.array_split(prefill, max(1, len(prefill) // 200_000)):
            self.client.pull_sparse(TABLE, chunk, DIM, min_version=0)

    def run(self, ids: np.ndarray, grads: np.ndarray) -> tuple[float, float]:
        """(pull seconds, push seconds) of one op."""
        version = self.step if self.mode == "sync" else 0
        t0 = time.perf_counter()
        rows = self.client.pull_sparse(TABLE, ids, DIM, min_version=version)
        t1 = time.perf_counter()
        self.client.push_sparse(TABLE, ids, grads, self.step)
        t2 = time.perf_counter()
        self.step += 1
        assert rows.shape == (len(ids), DIM)
        return t1 - t0, t2 - t1

    def check(self, ids: np.ndarray) -> None:
        """A push of gradient g moves a row by exactly -lr*g (SGD), as seen by the next pull."""
        version = self.step if self.mode == "sync" else 0
        probe = ids[:1000]
        before = self.client.pull_sparse(TABLE, probe, DIM, min_version=version)
        g = np.full((len(probe), DIM), 2.0, np.float32)
        self.client.push_sparse(TABLE, probe, g, self.step)
        self.step += 1
        version = self.step if self.mode == "sync" else 0
        after = self.client.pull_sparse(TABLE, probe, DIM, min_version=version)
        if not np.allclose(after, before - np.float32(LR) * g, atol=1e-6):
            raise AssertionError(f"{self.mode} server: a pushed SGD gradient did not move the rows by -lr*g")

    def stats(self) -> dict:
        return self.links.request(0, {"op": "stats"})[0]["stats"]

    def close(self) -> None:
        self.links.close()


class EbagCandidate:
    def __init__(self, vocab: int):
        import torch
        self.torch = torch
        self.bag = torch.nn.EmbeddingBag(vocab, DIM, mode="sum", sparse=True)
        self.opt = torch.optim.SGD(self.bag.parameters(), lr=LR)
        self.parts = {"forward": [], "backward": [], "optimizer step": []}

    def run(self, idx, grads) -> tuple[float, float]:
        """(forward seconds, backward + SGD step seconds); ``idx``, ``grads`` are tensors."""
        torch = self.torch
        offsets = torch.arange(len(idx))            # bags of 1
        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        out = self.bag(idx, offsets)
        t1 = time.perf_counter()
        out.backward(grads)
        t2 = time.perf_counter()
        self.opt.step()
        t3 = time.perf_counter()
        self.parts["forward"].append(t1 - t0)
        self.parts["backward"].append(t2 - t1)
        self.parts["optimizer step"].append(t3 - t2)
        return t1 - t0, t3 - t1

    def check(self, idx) -> None:
        torch = self.torch
        probe = idx[:1000]
        before = self.bag.weight.detach()[probe].clone()
        g = torch.full((len(probe), DIM), 2.0)
        kept = {k: list(v) for k, v in self.parts.items()}
        self.run(probe, g)
        self.parts = kept
        after = self.bag.weight.detach()[probe]
        if not torch.allclose(after, before - LR * g, atol=1e-6):
            raise AssertionError("EmbeddingBag: the SGD step did not move the rows by -lr*g")


# -- breakdown of one paramshard op --------------------------------------------------------
def breakdown(ps: PsCandidate, echo: RawEcho, all_ids: np.ndarray, subsets: list, reps: int,
              rng) -> tuple[dict, dict]:
    """Median (and mean) ms of each phase of pull+push: steady (async server) and first touch."""
    from paramshard.optim import SGD
    from paramshard.server.core.barrier import Membership
    from paramshard.server.storage.sparse_table import SparseTable
    from paramshard.tables import Admission, Eviction
    from paramshard.transport import protocol
    client = ps.client
    n = len(subsets[0])
    grads = np.full((n, DIM), 1e-3, np.float32)
    out_rows = np.empty((n, DIM), np.float32)
    # a replica of the server's table, holding the same ids, timed phase by phase
    table = SparseTable(TABLE, DIM, 0, SGD(lr=LR), Admission(), Eviction(), 0.01, "async", Membership(1, grace=60.0))
    for chunk in np.array_split(all_ids, max(1, len(all_ids) // 200_000)):
        table.pull(chunk)
    steady: dict[str, list[float]] = {}
    first: dict[str, list[float]] = {}

    def add(d, name, seconds):
        d.setdefault(name, []).append(seconds * 1e3)

    for rep in range(reps):
        ids = subsets[rep % len(subsets)]
        # client side, as SparseClient.pull_sparse / push_sparse do it
        t0 = time.perf_counter()
        requests, part = client.pull_requests(TABLE, ids, 0)
        t1 = time.perf_counter()
        [protocol.encode(h, a) for _, h, a in requests]
        t2 = time.perf_counter()
        replies = client.links.request_list(requests)
        t3 = time.perf_counter()
        client.gather_rows(replies, requests, part, n, DIM)
        t4 = time.perf_counter()
        push = client.push_requests(TABLE, ids, grads, ps.step)
        t5 = time.perf_counter()
        [protocol.encode(h, a) for _, h, a in push]
        t6 = time.perf_counter()
        client.links.request_list(push)
        t7 = time.perf_counter()
        ps.step += 1
        add(steady, "client: partition ids (Partition.of, pull)", t1 - t0)
        add(steady, "client: encode (pull)", t2 - t1)
        add(steady, "pull round trip (send, server, reply)", t3 - t2)
        add(steady, "client: gather reply rows (gather_rows)", t4 - t3)
        add(steady, "client: partition ids + grads (push_requests)", t5 - t4)
        add(steady, "client: encode (push)", t6 - t5)
        add(steady, "push round trip (send, server, reply)", t7 - t6)
        # the same bytes through a bare pyzmq echo: the transport floor
        t0 = time.perf_counter()
        echo.round_trip([ids], n * DIM * 4, out_rows)
        t1 = time.perf_counter()
        echo.round_trip([ids, grads], 0)
        t2 = time.perf_counter()
        add(steady, "raw pyzmq: pull-sized round trip", t1 - t0)
        add(steady, "raw pyzmq: push-sized round trip", t2 - t1)
        # server side: the library's own SparseTable.pull and .push (async), timed in place
        t0 = time.perf_counter()
        table.pull(ids.copy(), trainer=0)                  # handle_pull_sparse copies the frame
        t1 = time.perf_counter()
        table.push(0, table.version, ids, grads, distinct=True)   # reuses the pull's rows
        t2 = time.perf_counter()
        add(steady, "server: SparseTable.pull (id->row lookup + row gather)", t1 - t0)
        add(steady, "server: SparseTable.push (cached rows, gather, SGD, put back)", t2 - t1)

        # first touch: SparseTable.rows_for creating every row
        new = rng.integers(2 ** 62, 2 ** 63, n, dtype=np.uint64)
        t0 = time.perf_counter()
        table.rows_for(new, create=True)
        t1 = time.perf_counter()
        add(first, "SparseTable.rows_for, all ids new (lookup, unique, insert, initial rows)", t1 - t0)
    med = {k: C.median(v) for k, v in steady.items()}
    first_stats = {k: (C.median(v), float(np.mean(v))) for k, v in first.items()}
    return med, first_stats


# -- driver -------------------------------------------------------------------------------
def measure(args, children) -> tuple[dict, dict, dict, dict]:
    import torch
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(12345)
    n, reps = args.rows, args.reps
    table_ids = np.unique(rng.integers(0, 2 ** 63, args.table_rows + 1000, dtype=np.uint64))[:args.table_rows]
    rng.shuffle(table_ids)
    nsub = 8
    sub_pos = [rng.choice(args.table_rows, n, replace=False) for _ in range(nsub)]   # rows 0..T-1
    subsets = [table_ids[p] for p in sub_pos]
    fresh = [rng.integers(2 ** 63, 2 ** 64 - 2, n, dtype=np.uint64) for _ in range(reps + args.warmup)]
    fresh = [np.unique(f) for f in fresh]            # distinct within a batch (collisions: ~0)
    fresh = [f[rng.permutation(len(f))] for f in fresh]
    grads = np.full((n, DIM), 1e-3, np.float32)
    grads_t = torch.from_numpy(grads)

    print(f"starting servers and filling {args.table_rows:,} rows ...", flush=True)
    cands = {PS_ASYNC: PsCandidate(children, "async", table_ids),
             PS_SYNC: PsCandidate(children, "sync", table_ids)}
    vocab = args.table_rows + (reps + args.warmup) * n
    cands[EBAG] = EbagCandidate(vocab)
    sub_t = [torch.from_numpy(p.astype(np.int64)) for p in sub_pos]
    fresh_t = [torch.arange(args.table_rows + i * n, args.table_rows + i * n + len(fresh[i]))
               [torch.from_numpy(rng.permutation(len(fresh[i])))] for i in range(len(fresh))]

    def run(c, case, i):
        if case == STEADY:
            if c == EBAG:
                return cands[c].run(sub_t[i % nsub], grads_t)
            return cands[c].run(subsets[i % nsub], grads)
        if c == EBAG:
            return cands[c].run(fresh_t[i], grads_t[:len(fresh[i])])
        return cands[c].run(fresh[i], grads[:len(fresh[i])])

    for c in CANDIDATES:
        cands[c].check(subsets[0] if c != EBAG else sub_t[0])
    times = {(c, case): [] for c in CANDIDATES for case in (STEADY, FIRST)}
    order = list(CANDIDATES)
    print(f"warm-up {args.warmup}, then {reps} interleaved repetitions ...", flush=True)
    for i in range(args.warmup):
        for c in order:
            run(c, STEADY, i)
            run(c, FIRST, i)
    for c in cands.values():
        if isinstance(c, EbagCandidate):
            c.parts = {k: [] for k in c.parts}
    for rep in range(reps):
        rot = order[rep % len(order):] + order[:rep % len(order)]
        for c in rot:
            times[(c, STEADY)].append(run(c, STEADY, rep))
        for c in rot:
            times[(c, FIRST)].append(run(c, FIRST, args.warmup + rep))
        children.check_alive()
    for c in CANDIDATES:
        cands[c].check(subsets[1] if c != EBAG else sub_t[1])
    stats = cands[PS_ASYNC].stats()
    print("breakdown ...", flush=True)
    echo = RawEcho(children)
    try:
        phases = breakdown(cands[PS_ASYNC], echo, np.concatenate([table_ids, *fresh]), subsets,
                           max(7, reps // 2), rng)
    finally:
        echo.close()
    ebag_parts = {k: C.median(v) * 1e3 for k, v in cands[EBAG].parts.items()}
    for c in cands.values():
        if isinstance(c, PsCandidate):
            c.close()
    return times, phases, ebag_parts, stats


def report(args, times, phases, ebag_parts, stats, markdown: bool, note: str) -> None:
    n = args.rows
    steady_phases, first_phases = phases
    med = {k: C.median([a + b for a, b in v]) for k, v in times.items()}
    part_a = {k: C.median([a for a, _ in v]) for k, v in times.items()}
    part_b = {k: C.median([b for _, b in v]) for k, v in times.items()}
    headers = ["case", "candidate", "ms / op", "p25-p75 ms", "pull or fwd ms", "push or bwd+step ms",
               "rows/s", "ratio vs EmbeddingBag"]
    right = [False, False, True, True, True, True, True, True]
    rows = []
    for case in (STEADY, FIRST):
        for c in CANDIDATES:
            q1, q3 = C.quartiles(sorted(a + b for a, b in times[(c, case)]))
            ratio = med[(EBAG, case)] / med[(c, case)]
            rows.append([case, c, f"{med[(c, case)] * 1e3:.1f}", f"{q1 * 1e3:.1f}-{q3 * 1e3:.1f}",
                         f"{part_a[(c, case)] * 1e3:.1f}", f"{part_b[(c, case)] * 1e3:.1f}",
                         f"{n / med[(c, case)] / 1e6:.2f}M", f"{ratio:.2f}x"])
    pheaders = ["phase (paramshard async, steady, one op of pull+push)", "ms (median)"]
    prows = [[k, f"{v:.2f}"] for k, v in steady_phases.items()]
    fheaders = ["first-touch phase (SparseTable.rows_for create path, 100k new ids)", "median ms", "mean ms"]
    frows = [[k, f"{m:.2f}", f"{a:.2f}"] for k, (m, a) in first_phases.items()]
    frows.append(["total", f"{sum(m for m, _ in first_phases.values()):.1f}",
                  f"{sum(a for _, a in first_phases.values()):.1f}"])
    server = sum(v for k, v in steady_phases.items() if k.startswith("server:"))
    client = sum(v for k, v in steady_phases.items() if k.startswith("client:"))
    rtt = (steady_phases["pull round trip (send, server, reply)"]
           + steady_phases["push round trip (send, server, reply)"])
    raw = steady_phases["raw pyzmq: pull-sized round trip"] + steady_phases["raw pyzmq: push-sized round trip"]
    summary = [["client-side work (partition, encode, gather)", f"{client:.1f}"],
               ["server compute (sum of the server: phases, replica table)", f"{server:.1f}"],
               ["raw pyzmq round trips of the same bytes (transport floor)", f"{raw:.1f}"],
               ["the two round trips as measured (server compute + transport + framing)", f"{rtt:.1f}"],
               ["EmbeddingBag forward / backward / SGD step",
                " / ".join(f"{ebag_parts[k]:.1f}" for k in ("forward", "backward", "optimizer step"))]]
    tstats = stats.get("tables", {}).get(TABLE, {})
    extra = (f"{n:,} distinct ids per op, dim {DIM}, SGD lr {LR}; steady table of {args.table_rows:,} rows "
             f"(random subset per op); EmbeddingBag vocab {args.table_rows + (args.reps + args.warmup) * n:,}; "
             f"torch threads {_threads()}; async server ended with {tstats.get('rows', 0):,} rows. "
             f"ratio = EmbeddingBag ms / candidate ms (= rows/s ratio; target >= 0.5x). Server phases are "
             f"timed on an in-process SparseTable holding the same ids.")
    C.emit(markdown, [
        ("Sparse rows: pull+push vs EmbeddingBag", headers, rows, right),
        ("Where the paramshard time goes", pheaders, prows, [False, True]),
        ("Summary", ["summary of the breakdown", "ms"], summary, [False, True]),
        ("First touch: row creation", fheaders, frows, [False, True, True]),
    ], [extra, note])


def _threads() -> int:
    import torch
    return torch.get_num_threads()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=100_000, help="distinct ids per pull+push")
    p.add_argument("--table-rows", type=int, default=1_000_000, help="rows in the table for the steady case")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads in this process (default 1: on 2 shared vCPUs, 2 threads "
                        "under load were measured 2-5x slower)")
    p.add_argument("--markdown", action="store_true", help="print markdown tables for RESULTS.md")
    args = p.parse_args(argv)
    if args.table_rows < args.rows:
        p.error("--table-rows must be >= --rows")
    C.install_sigterm_as_exit()
    note = C.machine_note()
    children = C.Children()
    t_start = time.monotonic()
    try:
        times, phases, ebag_parts, stats = measure(args, children)
    finally:
        children.stop_all()
    load = os.getloadavg()[0]
    note += (f"; load average {load:.2f} at end; {args.reps} reps after {args.warmup} warm-up, candidates "
             f"interleaved; {time.monotonic() - t_start:.0f} s")
    report(args, times, phases, ebag_parts, stats, args.markdown, note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
