"""One trainer of benchmarks/modes.py: the same script under every ``paramshard launch --mode``.

    paramshard launch --servers 2 --trainers 2 --mode sync benchmarks/modes_train.py \\
        --workload dense --result DIR
    paramshard launch --servers 0 --trainers 2 --mode collective benchmarks/modes_train.py \\
        --workload ctr --data DIR --result DIR

Workloads:
- ``dense``: an MLP 64-512-512-10 (301,066 parameters, 1.2 MB) on scikit-learn's
  digits, loaded and split as examples/digits_mlp.py does; metric: test accuracy.
- ``ctr``: paramshard.models.WideDeep(criteo_schema(), dim 16) on the synthetic
  Criteo shards of examples/ctr_wide_deep.py (written by the driver); metric:
  test AUC and logloss. Sync, async and hybrid keep the two tables (wide, deep)
  on the servers as ``ps.SparseEmbedding`` (the models' default factory,
  Adagrad); collective mode has no servers, so each table is a hashed
  ``torch.nn.EmbeddingBag`` (``paramshard.models.hashed_embedding``) that every trainer holds whole and
  whose dense gradient is allreduced every step.

Every trainer builds its batches before anything is timed (data loading is not
measured), runs ``--warmup`` untimed steps, meets the others at two barriers
(between which the chief reads the servers' counters), then times its loop:
samples and seconds; after one more barrier (by then every push of the loop
is answered) it reads the bytes its TCP sockets sent and received since the
start, and the chief the servers' counters again; then the chief pulls the
final values and evaluates. Each trainer writes ``trainer-<id>.json`` into
``--result``; the driver sums them.

Bytes: ``tcp_counters`` reads TCP_INFO of every TCP socket this process holds
(bytes sent, bytes received; split by whether the peer is a parameter server).
/proc/self/io ``wchar`` is recorded too, for comparison only: it counts
write(2)/writev(2), which gloo uses, but not send(2)/sendmsg(2), which ZeroMQ
uses, so it misses every byte a trainer sends to the servers. The launcher's
progress records (one stdout line about every second) are in ``wchar``; the
bytes written to stdout during the loop are counted (``CountingStdout``) and
reported beside it so they can be taken out.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

# Model and optimizer settings, the same in every mode.
DENSE_HIDDEN = (512, 512)
DENSE_LR = 1e-3              # Adam on the dense parameters, both workloads
TABLE_LR = 0.05              # Adagrad on the servers' tables (sync, async, hybrid)
CTR_DIM = 16
EVAL_BATCH = 8192


# ===================================================================== bytes on the wire
# struct tcp_info (linux/tcp.h): byte offsets of the 64-bit counters used here.
_TCPI_BYTES_RECEIVED = 128
_TCPI_BYTES_SENT = 200         # kernel >= 4.19; includes retransmissions ...
_TCPI_BYTES_RETRANS = 208      # ... which are taken out (none on loopback, in practice)
_TCPI_LEN = 216


def tcp_counters(servers: tuple[str, ...]) -> dict[str, int]:
    """Cumulative bytes sent/received by every TCP socket of this process, whoever owns
    the socket (ZeroMQ's I/O thread, gloo, the rendezvous store). ``*_servers``: the
    part whose peer is one of ``servers`` ("host:port")."""
    out = {"sent": 0, "recv": 0, "sent_servers": 0, "recv_servers": 0, "sockets": 0}
    server_set = set(servers)
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(name)))    # a duplicate: closing it leaves the original
        except OSError:
            continue          # closed meanwhile, or not a socket Python can wrap
        try:
            if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
                continue
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCPI_LEN)
            if len(info) < _TCPI_LEN:
                raise RuntimeError("this kernel's TCP_INFO has no tcpi_bytes_sent (Linux >= 4.19 needed)")
            (received,) = struct.unpack_from("Q", info, _TCPI_BYTES_RECEIVED)
            sent, retrans = struct.unpack_from("QQ", info, _TCPI_BYTES_SENT)
            try:
                host, port = sock.getpeername()[:2]
                to_server = f"{host}:{port}" in server_set
            except OSError:
                to_server = False        # a listening socket: no peer, no bytes
            out["sent"] += sent - retrans
            out["recv"] += received
            out["sockets"] += 1
            if to_server:
                out["sent_servers"] += sent - retrans
                out["recv_servers"] += received
        except OSError:
            pass
        finally:
            sock.close()
    return out


def wchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    raise RuntimeError("no wchar in /proc/self/io")


class CountingStdout:
    """sys.stdout that counts the bytes written through it (the launcher's progress records)."""

    def __init__(self, inner):
        self.inner, self.bytes = inner, 0

    def write(self, text):
        self.bytes += len(text.encode("utf-8", "replace"))
        return self.inner.write(text)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class Meter:
    """Time, samples and byte counters over the timed loop of one trainer."""

    def __init__(self, servers: tuple[str, ...], stdout: CountingStdout):
        self.servers, self.stdout = servers, stdout
        self.samples = self.steps = 0
        self.paused_s = 0.0                 # evaluation pauses: off the clock
        self.paused_tcp = {k: 0 for k in ("sent", "recv", "sent_servers", "recv_servers")}

    def start(self) -> None:
        self.tcp0, self.wchar0, self.stdout0 = tcp_counters(self.servers), wchar(), self.stdout.bytes
        self.t0 = time.perf_counter()
        self.wall0 = time.time()       # the window on the wall clock, for a driver that samples CPU time

    def tick(self, samples: int) -> None:
        self.samples += samples
        self.steps += 1

    def elapsed(self) -> float:
        """Timed seconds so far, the pauses taken out."""
        return time.perf_counter() - self.t0 - self.paused_s

    def pause(self, seconds: float, tcp_before: dict | None = None, tcp_after: dict | None = None) -> None:
        """Take a pause (an evaluation) off the clock and, when given, its sockets' bytes off the counts."""
        self.paused_s += seconds
        if tcp_before is not None and tcp_after is not None:
            for k in self.paused_tcp:
                self.paused_tcp[k] += tcp_after[k] - tcp_before[k]

    def stop_clock(self) -> None:
        self.seconds = self.elapsed()
        self.wall1 = time.time()
        self.stdout1 = self.stdout.bytes

    def stop_bytes(self) -> dict:
        """After the closing barrier: async pushes still in flight at the end of the loop have been
        answered by then, so the window holds every byte of its steps (and a barrier's few bytes)."""
        wchar1, tcp1 = wchar(), tcp_counters(self.servers)
        delta = {k: tcp1[k] - self.tcp0[k] - self.paused_tcp[k] for k in ("sent", "recv", "sent_servers", "recv_servers")}
        return {"steps_timed": self.steps, "samples_timed": self.samples, "seconds_timed": self.seconds,
                "samples_per_s": self.samples / self.seconds, "tcp": delta, "tcp_sockets": tcp1["sockets"],
                "wchar": wchar1 - self.wchar0, "stdout_bytes": self.stdout1 - self.stdout0,
                "window": [self.wall0, self.wall1], "paused_s": self.paused_s}


def server_bytes_out(trainer) -> int:
    """Sum of the servers' ``bytes_out`` (the array payloads of their replies); 0 without servers."""
    return sum(int(s["bytes_out"]) for s in trainer.server_stats())


# ===================================================================== models and data
def build_ctr_model(collective: bool, buckets: int, seed: int):
    import torch

    import paramshard as ps
    from paramshard.data import criteo_schema
    from paramshard.models import WideDeep, hashed_embedding
    torch.manual_seed(seed)
    if collective:
        return WideDeep(criteo_schema(), dim=CTR_DIM, embedding=hashed_embedding(buckets))
    return WideDeep(criteo_schema(), dim=CTR_DIM, table_optimizer=ps.optim.Adagrad(lr=TABLE_LR))


def build_dense_model(seed: int):
    import torch
    import torch.nn as nn
    torch.manual_seed(seed)
    widths = (64, *DENSE_HIDDEN)
    layers = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(widths[-1], 10))


def dense_batches(args, env) -> tuple[list, tuple]:
    """This trainer's batches for every epoch (the digits example's split and shuffles), and the test set."""
    import torch
    from torch.utils.data import DataLoader

    import paramshard as ps
    from digits_mlp import load_data
    train_set, test = load_data(args.seed)
    my_share = ps.shard(train_set, batch_size=args.batch_size)
    batches = []
    for epoch in range(args.epochs):
        # The same shuffle seed on every trainer keeps the steps aligned, as in the example.
        loader = DataLoader(my_share, batch_size=args.batch_size, shuffle=True,
                            generator=torch.Generator().manual_seed(args.seed + epoch))
        batches += list(loader)
    return batches, test


def ctr_batches(args, env) -> list:
    """This trainer's shard as tensors, as examples/ctr_wide_deep.py reads it; every trainer
    takes the same number of steps (``--steps``, at most what a shard holds)."""
    import torch

    from paramshard.data import CriteoReader, shard_files
    files = shard_files(Path(args.data) / "shards", env.trainer_id, env.num_trainers)
    batches = [b for b in CriteoReader(files, args.batch_size, skip_bad_lines=True)
               if len(b.labels) == args.batch_size]
    steps = args.warmup + args.steps
    if len(batches) < steps:
        raise SystemExit(f"trainer {env.trainer_id}: {len(batches)} full batches of {args.batch_size} in its "
                         f"shard, {steps} steps asked for: more --train-rows, or fewer --steps")
    return [(torch.from_numpy(b.dense), torch.from_numpy(b.sparse_ids.view(np.int64)), torch.from_numpy(b.labels))
            for b in batches[:steps]]


# ===================================================================== the two loops
def run_dense(args, env, trainer, model, meter: Meter) -> dict:
    import torch
    import torch.nn.functional as F
    batches, (x_test, y_test) = dense_batches(args, env)
    warm, timed = batches[:args.warmup], batches[args.warmup:]
    for x, y in warm:
        trainer.step(F.cross_entropy(model(x), y))
    start_window(trainer, meter)
    for x, y in timed:
        trainer.step(F.cross_entropy(model(x), y))
        meter.tick(len(y))
    out = end_window(trainer, meter)
    if trainer.is_chief:
        trainer.pull()              # async: the values after every push
        model.eval()
        with torch.no_grad():
            out["accuracy"] = (model(x_test).argmax(1) == y_test).float().mean().item()
    out["total_steps"] = len(batches)
    return out


def run_ctr(args, env, trainer, model, meter: Meter) -> dict:
    import torch.nn.functional as F
    from ctr_wide_deep import evaluate
    tensors = ctr_batches(args, env)
    warm, timed = tensors[:args.warmup], tensors[args.warmup:]
    # prefetching (as the example): the next batch's rows are on their way while this one
    # trains; with no SparseEmbedding (collective mode) it is the plain loop.
    for dense, ids, labels in trainer.prefetching(warm):
        trainer.step(F.binary_cross_entropy_with_logits(model(dense, ids), labels))
    curve = Curve(args, env, trainer, model, meter) if args.eval_every else None
    start_window(trainer, meter)
    for dense, ids, labels in trainer.prefetching(timed):
        trainer.step(F.binary_cross_entropy_with_logits(model(dense, ids), labels))
        meter.tick(len(labels))
        if curve is not None and meter.steps % args.eval_every == 0:
            curve.point()
    out = end_window(trainer, meter)
    if curve is not None and trainer.is_chief:
        out["curve"] = curve.points
    if trainer.is_chief:
        trainer.pull()
        out["auc"], out["logloss"] = evaluate(model, Path(args.data) / "test.tsv", EVAL_BATCH)
    out["total_steps"] = len(tensors)
    return out


class Curve:
    """``--eval-every N``: a held-out AUC every N timed steps, for the time to a target AUC.

    What is evaluated: trainer 0's model as it trains, without ``trainer.pull()`` (in GEO mode
    a pull or a barrier would send the round early and change the k under test): its dense
    values, and the rows as its backend reads them in eval mode (sync, async: the servers'
    current rows; GEO: the rows its replica holds, the servers' for the others). The held-out
    set is the first ``--eval-rows`` rows of test.tsv, read before the clock starts.

    How it is counted: every trainer stops its clock after its N-th step; trainer 0 evaluates,
    then writes ``eval-<step>.done`` into ``--result`` (the ranks share this machine's files:
    no barrier, for the reason above); the others wait for that file, then all restart their
    clocks. So the pause is off the throughput clock and off the time-to-AUC clock (the point's
    ``seconds``: trainer 0's timed seconds so far); its TCP bytes (trainer 0's eval reads) are
    off the TCP counts; the driver takes the link bytes of the pauses (``wall``) out of the
    wire counts. A GEO backend's round clock skips the pause too (``paused``): auto-k would
    otherwise read the evaluation as slow steps."""

    WAIT_S = 600.0       # a trainer waits this long for trainer 0's evaluation, then fails

    def __init__(self, args, env, trainer, model, meter: Meter):
        self.args, self.trainer, self.model, self.meter = args, trainer, model, meter
        self.result = Path(args.result)
        self.points: list[dict] = []
        self.batches = read_eval_rows(Path(args.data) / "test.tsv", args.eval_rows) if trainer.is_chief else []

    def point(self) -> None:
        import contextlib
        from paramshard.inference.evaluation import evaluate as ps_evaluate
        step = self.meter.steps
        seconds = self.meter.elapsed()
        started, wall0 = time.perf_counter(), time.time()
        hold = getattr(self.trainer.backend, "paused", None)      # GEO: its round clock skips the pause
        with (hold() if hold is not None else contextlib.nullcontext()):
            marker = self.result / f"eval-{step}.done"
            if self.trainer.is_chief:
                tcp0 = tcp_counters(self.meter.servers)
                m = ps_evaluate(self.model, self.batches)
                tcp1 = tcp_counters(self.meter.servers)
                marker.write_text("")
                self.points.append({"step": step, "seconds": seconds, "auc": m["auc"], "logloss": m["logloss"],
                                    "eval_s": time.perf_counter() - started, "wall": [wall0, time.time()]})
            else:
                tcp0 = tcp1 = None
                deadline = time.monotonic() + self.WAIT_S
                while not marker.exists():
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"trainer {self.trainer.env.trainer_id}: trainer 0 did not finish "
                                           f"its evaluation after step {step} within {self.WAIT_S:g} s "
                                           f"(no {marker}): see trainer 0's log")
                    time.sleep(0.005)
        self.meter.pause(time.perf_counter() - started, tcp0, tcp1)


def read_eval_rows(path: Path, rows: int) -> list:
    """The first ``rows`` rows of ``path`` as CriteoBatches of EVAL_BATCH (all of them for 0)."""
    from paramshard.data import CriteoReader
    out, left = [], rows or float("inf")
    for b in CriteoReader([path], EVAL_BATCH):
        if left <= 0:
            break
        if len(b) > left:
            b = b.take(0, int(left))
        out.append(b)
        left -= len(b)
    return out


def start_window(trainer, meter: Meter) -> None:
    """Every trainer past its warm-up (and, async, its pushes on the servers); the chief reads the
    servers' counters while the others wait at the second barrier; then each starts its clock."""
    trainer.barrier("modes-start")
    if trainer.is_chief:
        meter.server_out0 = server_bytes_out(trainer)
    trainer.barrier("modes-start-2")
    meter.start()


def end_window(trainer, meter: Meter) -> dict:
    """The clock stops at the end of the loop (an async push may still be in flight, as after
    any user's loop); the byte counters after the closing barrier, the servers' with them."""
    meter.stop_clock()
    trainer.barrier("modes-end")     # every push of the window is on the servers and answered
    out = meter.stop_bytes()
    if trainer.is_chief:
        out["server_bytes_out"] = server_bytes_out(trainer) - meter.server_out0
    return out


# ===================================================================== main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description="one trainer of benchmarks/modes.py")
    p.add_argument("--workload", choices=("dense", "ctr"), required=True)
    p.add_argument("--result", required=True, help="directory for trainer-<id>.json")
    p.add_argument("--data", help="ctr: the driver's data directory (shards/, test.tsv)")
    p.add_argument("--batch-size", type=int, default=None, help="per trainer (dense 32, ctr 1024)")
    p.add_argument("--epochs", type=int, default=12, help="dense: epochs over the trainer's share")
    p.add_argument("--steps", type=int, default=100, help="ctr: timed steps per trainer")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per trainer before the timed loop")
    p.add_argument("--buckets", type=int, default=1 << 17, help="ctr, collective: rows per hashed table")
    p.add_argument("--eval-every", type=int, default=0,
                   help="ctr: a held-out AUC every N timed steps, off the clock (class Curve); 0: only the final one")
    p.add_argument("--eval-rows", type=int, default=20_000, help="ctr, --eval-every: held-out rows (0: all of test.tsv)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.batch_size is None:
        args.batch_size = 32 if args.workload == "dense" else 1024
    if args.workload == "ctr" and not args.data:
        p.error("--workload ctr needs --data")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import paramshard as ps
    env = ps.init()                 # a server rank serves here and exits
    import torch
    torch.set_num_threads(1)        # as the launcher's OMP_NUM_THREADS (2 cores, 2-4 processes)
    stdout = CountingStdout(sys.stdout)
    sys.stdout = stdout             # the trainer's progress records go through here
    collective = env.mode == "collective"
    model = (build_dense_model(args.seed) if args.workload == "dense"
             else build_ctr_model(collective, args.buckets, args.seed))
    trainer = ps.Trainer(model, optimizer=ps.optim.Adam(lr=DENSE_LR))
    try:
        meter = Meter(tuple(env.servers), stdout)
        out = (run_dense if args.workload == "dense" else run_ctr)(args, env, trainer, model, meter)
        out.update(trainer_id=env.trainer_id, num_trainers=env.num_trainers, mode=env.mode,
                   servers=len(env.servers), dense_params=sum(p.numel() for p in model.parameters()),
                   dense_bytes=sum(p.numel() * p.element_size() for p in model.parameters()))
        path = Path(args.result) / f"trainer-{env.trainer_id}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(out))
        os.replace(tmp, path)       # the driver never reads half a file
    except BaseException:
        trainer.close(leave=False)  # the others stop too, instead of waiting for this trainer
        raise
    trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
