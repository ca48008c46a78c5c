"""What CurveZMQ costs: the CTR job at 2 servers + 2 trainers, encrypted (the default) vs ``--insecure``.

The same ``paramshard launch`` job as the CTR workload of benchmarks/modes.py (sync
PS mode: WideDeep dim 16, MLP 400-400-1, synthetic Criteo, batch 1024 per trainer,
tables on the servers; the trainers run benchmarks/modes_train.py), twice per round:

- encrypted: no PARAMSHARD_SECRET, so the launcher makes one and every connection
  between trainers and servers is CurveZMQ (what a user gets);
- plain: the same command with ``--insecure``.

The two alternate, the first of each round swapped every round, so machine noise
hits both alike. Each run is a fresh launch with a deadline; samples/s is summed
over the trainers' timed loops (warm-up and start-up outside them); bytes per
step are wire bytes (TCP_INFO of every trainer socket), so CurveZMQ's own
overhead (a MAC and a nonce per message) shows. The tables give medians, min-max
and the ratio of each round's pair.

    .venv/bin/python benchmarks/encryption_cost.py [--repeats 5] [--markdown]
    .venv/bin/python benchmarks/encryption_cost.py --quick       # smoke test: a few steps, 1 round
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
import modes as M  # noqa: E402  (the CTR workload, its data and its result files)
from ps_vs_pytorch import child_environ  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
THIS = Path(__file__).resolve()
CANDIDATES = {"encrypted": "CurveZMQ (default: a secret made per job)", "plain": "plain TCP (--insecure)"}


TICK = os.sysconf("SC_CLK_TCK")


def descendants_cpu(root: int) -> float:
    """CPU seconds (user + system, every thread) of the processes below ``root`` right now."""
    stats = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                text = f.read()
        except OSError:
            continue
        rest = text[text.rindex(")") + 2:].split()
        stats[int(name)] = (int(rest[1]), int(rest[11]) + int(rest[12]))   # ppid, utime + stime
    below, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, (ppid, _) in stats.items() if ppid in frontier} - below
        below |= frontier
    return sum(stats[pid][1] for pid in below) / TICK


class CpuSampler:
    """Samples the CPU time of every process of the job (the launcher and its ranks, all below
    this process) every ``interval`` s, so that the trainers' timed window can be cut out of it:
    CPU per step does not depend on what else runs on the machine, samples/s does."""

    def __init__(self, interval: float = 0.1):
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.samples.append((time.time(), descendants_cpu(os.getpid())))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)

    def between(self, start: float, end: float) -> float:
        t = np.array([s[0] for s in self.samples])
        cpu = np.array([s[1] for s in self.samples])
        if len(t) < 2 or start < t[0] or end > t[-1]:
            raise RuntimeError("the CPU samples do not cover the timed window")
        return float(np.interp(end, t, cpu) - np.interp(start, t, cpu))


# ===================================================================== where the cost comes from
def echo_cpu(curve: bool, size: int, frames: int, n: int = 40) -> float:
    """CPU ms per MiB moved (this process and its libzmq I/O threads: both ends live here) by
    a DEALER -> ROUTER -> DEALER echo of ``size`` bytes in ``frames`` frames, plain or CurveZMQ."""
    import zmq

    from paramshard.transport.security import Security
    sec = Security.from_secret("bench", "bench") if curve else None
    server_ctx = sec.server_context() if curve else None
    ctx = server_ctx.context if curve else zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    if curve:
        sec.configure_server(router)
    port = router.bind_to_random_port(f"tcp://{C.HOST}")
    client_ctx = zmq.Context()
    dealer = client_ctx.socket(zmq.DEALER)
    if curve:
        sec.configure_client(dealer)
    dealer.connect(f"tcp://{C.HOST}:{port}")
    payload = [np.ones(size // frames, np.uint8) for _ in range(frames)]
    cpu0 = 0.0
    for k in range(n + 3):
        if k == 3:
            cpu0 = time.process_time()
        dealer.send_multipart(payload, copy=False)
        router.send_multipart(router.recv_multipart(copy=False), copy=False)
        dealer.recv_multipart(copy=False)
    cpu = time.process_time() - cpu0
    dealer.close(0)
    router.close(0)
    client_ctx.term()
    if curve:
        server_ctx.close()
    else:
        ctx.term()
    return cpu / (2 * n * size / 2**20) * 1e3


def cipher_floor() -> float | None:
    """CPU ms per MiB of libsodium's crypto_secretbox_easy (XSalsa20-Poly1305, CurveZMQ's cipher
    for every message) in the libsodium pyzmq bundles, or None when it cannot be found."""
    import ctypes
    import glob

    import zmq
    found = glob.glob(os.path.join(os.path.dirname(zmq.__file__), os.pardir, "pyzmq.libs", "libsodium*"))
    if not found:
        return None
    lib = ctypes.CDLL(found[0])
    lib.sodium_init()
    box = lib.crypto_secretbox_easy
    box.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_void_p, ctypes.c_void_p]
    n = 4 << 20
    plain, sealed = np.ones(n, np.uint8), np.empty(n + 16, np.uint8)
    nonce, key = np.zeros(24, np.uint8), np.ones(32, np.uint8)
    times = []
    for _ in range(9):
        t = time.process_time()
        box(sealed.ctypes.data, plain.ctypes.data, n, nonce.ctypes.data, key.ctypes.data)
        times.append(time.process_time() - t)
    return C.median(times) / 4 * 1e3


def floor_table() -> tuple:
    rows = []
    for size, frames in ((1 << 20, 1), (1 << 20, 16), (4 << 20, 1), (4 << 20, 64)):
        plain = C.median(echo_cpu(False, size, frames) for _ in range(3))
        curve = C.median(echo_cpu(True, size, frames) for _ in range(3))
        rows.append([f"{size >> 20} MiB in {frames} frame{'s' if frames > 1 else ''} of {size // frames >> 10} KiB",
                     f"{plain:.2f}", f"{curve:.2f}", f"{curve - plain:.2f}"])
    floor = cipher_floor()
    if floor is not None:
        rows.append(["libsodium crypto_secretbox_easy alone, one side (4 MiB)", "-", f"{floor:.2f}", "-"])
    return ("Where it goes: CPU ms per MiB moved, echo over loopback (both ends in one process)",
            ["messages", "plain", "CurveZMQ", "extra"], rows, [False, True, True, True])


# ===================================================================== the CTR job
def run_one(children: C.Children, candidate: str, args, data_dir: Path, workdir: Path) -> dict:
    result = Path(tempfile.mkdtemp(prefix=f"result-{candidate}-", dir=workdir))
    try:
        argv = M.job_argv("ctr", "sync", args, data_dir, result, result / "run")
        if candidate == "plain":
            argv.insert(argv.index("launch") + 1, "--insecure")
        with CpuSampler() as cpu:
            trainers = C.run_for_results(children, f"ctr 2+2, {candidate}", argv, child_environ(), result,
                                         M.TRAINERS, args.run_timeout)
        secret = (result / "run" / "secret").exists()
        if secret != (candidate == "encrypted"):      # the comparison must be what it says
            raise RuntimeError(f"{candidate} run: the run directory {'has' if secret else 'lacks'} a job secret")
        r = M.combine(trainers)
        start, end = min(t["window"][0] for t in trainers), max(t["window"][1] for t in trainers)
        r["cpu_per_step"] = cpu.between(start, end) / r["steps"]
        r["cpu_busy"] = cpu.between(start, end) / (end - start)      # cores the job kept busy
        return r
    finally:
        shutil.rmtree(result, ignore_errors=True)


def report(args, runs: dict, ctr_info: dict, command: str, note: str, floor: tuple) -> None:
    base = C.median(r["samples_per_s"] for r in runs["plain"])
    base_cpu = M.med(runs["plain"], "cpu_per_step")
    rows = []
    for candidate, label in CANDIDATES.items():
        rates = [r["samples_per_s"] for r in runs[candidate]]
        cpu = M.med(runs[candidate], "cpu_per_step")
        rows.append([label, f"{C.median(rates):,.0f}", f"{min(rates):,.0f}-{max(rates):,.0f}",
                     f"{C.median(rates) / base:.3f}x", f"{cpu * 1e3:.1f} ms", f"{cpu / base_cpu:.3f}x",
                     f"{M.med(runs[candidate], 'cpu_busy'):.2f}", f"{M.med(runs[candidate], 'bytes') / M.MB:.3f} MB",
                     f"{M.med(runs[candidate], 'auc'):.4f}"])
    headers = ["connections", "samples/s (median)", "min-max", "ratio to plain", "CPU per step, all processes",
               "CPU ratio", "cores busy", "bytes/step (median)", "test AUC"]
    pairs = [e["samples_per_s"] / p["samples_per_s"] for e, p in zip(runs["encrypted"], runs["plain"])]
    cpu_pairs = [e["cpu_per_step"] / p["cpu_per_step"] for e, p in zip(runs["encrypted"], runs["plain"])]
    prow = [["samples/s, encrypted / plain", ", ".join(f"{x:.3f}x" for x in pairs), f"{C.median(pairs):.3f}x"],
            ["CPU per step, encrypted / plain", ", ".join(f"{x:.3f}x" for x in cpu_pairs), f"{C.median(cpu_pairs):.3f}x"]]
    tables = [(f"CTR WideDeep, 2 servers + 2 trainers (sync): encrypted vs plain, median of {args.repeats} "
               f"interleaved rounds", headers, rows, [False] + [True] * 8),
              ("Each round's pair", ["measure", "each round", "median"], prow, [False, False, True]), floor]
    notes = [f"command: {command}",
             f"ctr: {args.ctr_train_rows:,} train rows (one shard per trainer), {args.ctr_test_rows:,} test rows; "
             f"hidden-model test AUC {ctr_info['hidden_auc']:.4f}; batch {args.ctr_batch} per trainer, "
             f"{args.warmup} warm-up + {args.ctr_steps} timed steps per trainer; 1 torch thread per process. "
             f"bytes/step: TCP bytes sent by the trainers and received from the servers over the timed loop, per "
             f"step of a trainer. CPU per step: user + system CPU time of every process of the job (launcher, "
             f"servers, trainers, all their threads: libzmq encrypts in its I/O thread) over the trainers' timed "
             f"window, sampled from /proc every 0.1 s, per step of a trainer; cores busy: that CPU time over the "
             f"window's wall time (2 would be both cores of this VM)", note]
    if not args.markdown:
        C.emit(False, tables, notes)
        return
    print(f"```\n{command}\n```\n")
    for title, headers, rows, right in tables:
        print(f"**{title}**\n")
        print(C.markdown_table(headers, rows, right))
        print()
    C.emit(True, [], notes)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--ctr-train-rows", type=int, default=240_000)
    p.add_argument("--ctr-test-rows", type=int, default=50_000)
    p.add_argument("--ctr-batch", type=int, default=1024, help="per trainer")
    p.add_argument("--ctr-steps", type=int, default=100, help="timed steps per trainer")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per trainer before the timed loop")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-timeout", type=float, default=300.0, help="deadline of one run, s")
    p.add_argument("--launch-timeout", type=float, default=120.0, help="paramshard launch --timeout")
    p.add_argument("--quick", action="store_true", help="smoke test: a few steps, small data, 1 round")
    p.add_argument("--markdown", action="store_true", help="print markdown tables for RESULTS.md")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.warmup, args.ctr_train_rows, args.ctr_test_rows, args.ctr_steps = 1, 2, 30_000, 8192, 10
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    need = (args.warmup + args.ctr_steps) * args.ctr_batch * M.TRAINERS
    if need > args.ctr_train_rows:
        p.error(f"--ctr-train-rows {args.ctr_train_rows:,}: {need:,} rows needed")
    # What modes.job_argv reads for the CTR workload.
    args.buckets, args.dense_epochs, args.dense_batch = 1 << 17, 1, 32
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    command = shlex.join([os.path.relpath(sys.executable, ROOT), os.path.relpath(THIS, ROOT), *argv])
    C.install_sigterm_as_exit()
    note = C.machine_note()
    t_start = time.monotonic()

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    children = C.Children()
    workdir = Path(tempfile.mkdtemp(prefix="bench-encryption-"))
    runs: dict[str, list] = {c: [] for c in CANDIDATES}
    try:
        log(f"generating {args.ctr_train_rows + args.ctr_test_rows:,} rows of synthetic Criteo data ...")
        ctr_info = M.prepare_ctr_data(workdir / "data", args.ctr_train_rows, args.ctr_test_rows, args.buckets)
        for rnd in range(args.repeats):
            order = list(CANDIDATES) if rnd % 2 == 0 else list(CANDIDATES)[::-1]
            for candidate in order:
                r = run_one(children, candidate, args, ctr_info["dir"], workdir)
                runs[candidate].append(r)
                log(f"round {rnd + 1}/{args.repeats}: {candidate:9} {r['samples_per_s']:9,.0f} samples/s  "
                    f"{r['cpu_per_step'] * 1e3:6.1f} ms CPU/step  {r['cpu_busy']:.2f} cores  "
                    f"{r['bytes'] / M.MB:7.3f} MB/step  AUC {r['auc']:.4f}")
    finally:
        children.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    log("measuring CurveZMQ's cost per MiB ...")
    floor = floor_table()
    note += f"; load average {os.getloadavg()[0]:.2f} at end; {time.monotonic() - t_start:.0f} s"
    report(args, runs, ctr_info, command, note, floor)
    return 0


if __name__ == "__main__":
    sys.exit(main())
