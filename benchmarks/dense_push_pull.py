"""Dense push+pull through paramshard vs a raw pyzmq round trip vs gloo all_reduce.

One run, same machine, candidates interleaved per repetition (the machine is
noisy: a ratio from one run is what counts, DESIGN section 8):

- paramshard: ``DenseClient.push_dense(grads, step, out=values)`` against
  ``python -m paramshard server`` subprocesses (sync mode, 1 trainer, SGD): the
  gradient goes out, the updated parameter comes back, in one round trip.
  One parameter of the payload size; 1 server holding it as one block, and
  2 servers holding one half each.
- raw pyzmq: DEALER -> ROUTER echo in another process, ``copy=False`` both
  ways, the reply copied into a preallocated numpy array (as a trainer must
  put it into its parameters). The transport's ceiling for this exchange.
- gloo: ``torch.distributed.all_reduce`` of a float32 tensor of the payload
  size across 2 processes, timed in rank 0.

Throughput is 2 * payload / time for all three: the bytes the trainer (rank 0
for gloo) sends plus the bytes it receives. For a 2-rank ring all_reduce each
rank sends payload/2 in reduce-scatter and payload/2 in all-gather, and
receives as much, so 2 * payload is also the bytes through rank 0 there.

    .venv/bin/python benchmarks/dense_push_pull.py [--sizes 1,16,64] [--reps 21] [--markdown]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

PS1, PS2, RAW, GLOO = "paramshard 1 server", "paramshard 2 servers", "raw pyzmq", "gloo all_reduce"
CANDIDATES = (PS1, PS2, RAW, GLOO)
LR = 1e-3


# -- children ----------------------------------------------------------------------
def echo_server(conn, host: str) -> None:
    """ROUTER that sends every message straight back (copy=False both ways)."""
    C.serve_router(conn, host, lambda frames: frames)


def gloo_worker(conn, rank: int, port: int, sizes: list[int]) -> None:
    """One rank of a 2-process gloo group; runs the all_reduces the parent asks for."""
    import datetime as dt
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")   # loopback only
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{C.HOST}:{port}", rank=rank, world_size=2,
                            timeout=dt.timedelta(seconds=60))
    tensors = {n: torch.zeros(n // 4, dtype=torch.float32) for n in sizes}  # zeros: sums stay finite
    conn.send("ready")
    try:
        while conn.poll(600):
            msg = conn.recv()
            if msg is None:
                break
            nbytes, iters = msg
            t = tensors[nbytes]
            dist.barrier()                 # both ranks start together; not timed
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(t)
            conn.send((time.perf_counter() - t0) / iters)
    except EOFError:
        pass
    finally:
        dist.destroy_process_group()


# -- candidates, as seen from this process ---------------------------------------------------------
class ParamshardCandidate:
    """One trainer talking to a ``num_servers`` cluster; one flat parameter per payload size."""

    def __init__(self, children: C.Children, num_servers: int, sizes: list[int]):
        from paramshard.client.dense import DenseClient
        from paramshard.optim import SGD
        from paramshard.placement.sharding import ParamSpec, make_plan
        from paramshard.transport.links import ServerLinks
        self.addresses = C.start_paramshard_cluster(children, num_servers)
        self.links = ServerLinks(self.addresses, timeout=60.0, who="bench")
        C.wait_servers(children, self.links)
        self.clients, self.values, self.grads, self.step = {}, {}, {}, {}
        # 1 server: one block per parameter whatever the block size; more servers:
        # the default splits each evenly, one block per server. The chief registers
        # the whole model once; each size is then pushed by a client of its own
        # parameter (same block names, same servers).
        mbs = 8192
        specs = [ParamSpec(f"p{nbytes}", (nbytes // 4,)) for nbytes in sizes]
        whole = make_plan(specs, num_servers, min_block_size=mbs)
        DenseClient(self.links, whole, trainer_id=0).register_dense(
            {spec.name: np.zeros(spec.shape[0], np.float32) for spec in specs}, SGD(lr=LR))
        for nbytes, spec in zip(sizes, specs):
            numel, name = spec.shape[0], spec.name
            plan = make_plan([spec], num_servers, min_block_size=mbs)
            assert len(plan.blocks) == num_servers, plan.blocks
            assert {(b.name, b.server) for b in plan.blocks} <= {(b.name, b.server) for b in whole.blocks}
            client = DenseClient(self.links, plan, trainer_id=0)
            self.clients[nbytes] = (name, client)
            self.values[nbytes] = np.zeros(numel, np.float32)
            self.grads[nbytes] = np.ones(numel, np.float32)
            self.step[nbytes] = 0

    def run(self, nbytes: int, iters: int) -> float:
        name, client = self.clients[nbytes]
        grads, out = {name: self.grads[nbytes]}, {name: self.values[nbytes]}
        t0 = time.perf_counter()
        for _ in range(iters):
            client.push_dense(grads, self.step[nbytes], out=out)
            self.step[nbytes] += 1
        return (time.perf_counter() - t0) / iters

    def check(self, nbytes: int) -> None:
        """Not a no-op: after k SGD steps of gradient 1 from 0, every value is -k*lr."""
        v, k = self.values[nbytes], self.step[nbytes]
        want = np.float32(0)
        for _ in range(k):
            want = np.float32(want - np.float32(LR) * np.float32(1))
        for i in (0, v.size // 2 - 1, v.size // 2, v.size - 1):
            if not np.isclose(v[i], want, rtol=1e-4):
                raise AssertionError(f"paramshard returned {v[i]} at {i} after {k} steps, expected {want}")

    def close(self) -> None:
        self.links.close()


class RawZmqCandidate:
    def __init__(self, children: C.Children, sizes: list[int]):
        import zmq
        self.zmq = zmq
        conn = children.start_mp("raw pyzmq echo", echo_server, (C.HOST,))
        port = C.recv_with_timeout(conn, 30, "the echo server")
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, 60_000)    # a lost echo raises instead of hanging
        self.sock.setsockopt(zmq.SNDTIMEO, 60_000)
        self.sock.connect(f"tcp://{C.HOST}:{port}")
        self.payload = {n: np.ones(n // 4, np.float32) for n in sizes}
        self.out = {n: np.zeros(n // 4, np.float32) for n in sizes}

    def run(self, nbytes: int, iters: int) -> float:
        payload, out = self.payload[nbytes], self.out[nbytes]
        t0 = time.perf_counter()
        for _ in range(iters):
            self.sock.send(payload, copy=False)
            frame = self.sock.recv(copy=False)
            np.copyto(out, np.frombuffer(frame.buffer, np.float32))
            del frame    # as paramshard does: the receive buffer is freed before the next one
        return (time.perf_counter() - t0) / iters

    def check(self, nbytes: int) -> None:
        if not np.array_equal(self.out[nbytes][[0, -1]], [1, 1]):
            raise AssertionError("the echo did not come back")

    def close(self) -> None:
        self.sock.close(0)


class GlooCandidate:
    def __init__(self, children: C.Children, sizes: list[int]):
        from paramshard.launch.engines.ports import free_ports
        (port,) = free_ports(1, C.HOST)
        self.conns = [children.start_mp(f"gloo rank {r}", gloo_worker, (r, port, sizes)) for r in (0, 1)]
        for r, conn in enumerate(self.conns):
            if C.recv_with_timeout(conn, 90, f"gloo rank {r} (init_process_group)") != "ready":
                raise RuntimeError(f"gloo rank {r} failed to start")

    def run(self, nbytes: int, iters: int) -> float:
        for conn in self.conns:
            conn.send((nbytes, iters))
        elapsed = C.recv_with_timeout(self.conns[0], 120, "gloo rank 0")
        C.recv_with_timeout(self.conns[1], 120, "gloo rank 1")
        return elapsed

    def check(self, nbytes: int) -> None:
        pass

    def close(self) -> None:
        pass


# -- driver ----------------------------------------------------------------------------
def measure(cands: dict, sizes: list[int], reps: int, warmup: int, inner_bytes: int, children) -> dict:
    times = {(c, n): [] for c in cands for n in sizes}
    order = list(cands)
    for n in sizes:                                   # warm-up: first touches, connections, caches
        iters = max(1, inner_bytes // n)
        for _ in range(warmup):
            for c in order:
                cands[c].run(n, iters)
        for c in order:
            cands[c].check(n)
    for rep in range(reps):
        rot = order[rep % len(order):] + order[:rep % len(order)]   # no candidate always goes first
        for n in sizes:
            iters = max(1, inner_bytes // n)
            for c in rot:
                times[(c, n)].append(cands[c].run(n, iters))
        children.check_alive()
    for c in order:
        for n in sizes:
            cands[c].check(n)
    return times


def report(times: dict, sizes: list[int], cands: list[str], markdown: bool, note: str) -> None:
    gbps = lambda n, t: 2 * n / t / 1e9  # noqa: E731
    med = {k: C.median(v) for k, v in times.items()}
    headers = ["payload", "candidate", "ms/round trip", "p25-p75 ms", "GB/s"]
    right = [True, False, True, True, True]
    rows = []
    for n in sizes:
        for c in cands:
            q1, q3 = C.quartiles(sorted(times[(c, n)]))
            rows.append([C.size_label(n), c, f"{med[(c, n)] * 1e3:.2f}",
                         f"{q1 * 1e3:.2f}-{q3 * 1e3:.2f}", f"{gbps(n, med[(c, n)]):.2f}"])
    ratio_headers = ["payload", "1 srv / raw pyzmq", "1 srv / gloo", "2 srv / raw pyzmq", "2 srv / gloo"]
    ratio_rows = []
    for n in sizes:
        r = lambda a, b: f"{med[(b, n)] / med[(a, n)]:.2f}x" if (a, n) in med and (b, n) in med else "-"  # noqa: E731
        ratio_rows.append([C.size_label(n), r(PS1, RAW), r(PS1, GLOO), r(PS2, RAW), r(PS2, GLOO)])
    ratio_right = [True] * len(ratio_headers)
    if markdown:
        print(C.markdown_table(headers, rows, right))
        print()
        print("Throughput ratios (paramshard GB/s / peer GB/s; >1 means paramshard is faster):")
        print()
        print(C.markdown_table(ratio_headers, ratio_rows, ratio_right))
        print()
        print(f"_{note}_")
    else:
        from rich.console import Console
        from paramshard.observe.live.terminal import is_live_terminal
        # colours only for a terminal someone watches (not a file, nor a rank under mpirun)
        console = Console(width=max(Console().width, 100), force_terminal=is_live_terminal(sys.stdout))
        console.print(C.rich_table("Dense push+pull vs raw pyzmq vs gloo", headers, rows, right))
        console.print(C.rich_table("Ratios (paramshard GB/s / peer GB/s)", ratio_headers, ratio_rows,
                                   ratio_right))
        console.print("median of the repetitions; GB/s = 2 * payload / median time (bytes sent + received "
                      "by the trainer, or by gloo rank 0)")
        console.print(note)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1,16,64", help="payloads in MiB of float32, comma-separated")
    p.add_argument("--reps", type=int, default=21, help="timed repetitions per candidate and payload")
    p.add_argument("--warmup", type=int, default=3, help="untimed repetitions first")
    p.add_argument("--inner-mib", type=int, default=32,
                   help="each repetition does max(1, inner/payload) round trips and keeps their mean")
    p.add_argument("--markdown", action="store_true", help="print markdown tables for RESULTS.md")
    p.add_argument("--no-gloo", action="store_true", help="skip the gloo peer (quicker)")
    args = p.parse_args(argv)
    sizes = [int(float(s) * C.MiB) // 4 * 4 for s in args.sizes.split(",") if s.strip()]
    if not sizes or min(sizes) < 4 * 8192 * 2 or args.reps < 1:
        p.error("give --sizes of at least 0.0625 MiB (two 8192-element blocks) and --reps >= 1")
    C.install_sigterm_as_exit()
    note = C.machine_note()
    children = C.Children()
    cands: dict = {}
    t_start = time.monotonic()
    try:
        cands[PS1] = ParamshardCandidate(children, 1, sizes)
        cands[PS2] = ParamshardCandidate(children, 2, sizes)
        cands[RAW] = RawZmqCandidate(children, sizes)
        if not args.no_gloo:
            cands[GLOO] = GlooCandidate(children, sizes)
        times = measure(cands, sizes, args.reps, args.warmup, args.inner_mib * C.MiB, children)
    finally:
        for c in cands.values():
            c.close()
        children.stop_all()
    load = os.getloadavg()[0]
    note += (f"; load average {load:.2f} at end; {args.reps} reps after {args.warmup} warm-up, "
             f"candidates interleaved; {time.monotonic() - t_start:.0f} s")
    report(times, sizes, list(cands), args.markdown, note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
