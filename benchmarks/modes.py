"""The four training modes side by side: sync PS, async PS, collective, hybrid.

The same script (benchmarks/modes_train.py) trains the same models under
``paramshard launch --mode M``, 2 trainers each, on 2 parameter servers
except in collective mode (``--servers 0``):

1. dense: an MLP 64-512-512-10 (301,066 parameters, 1.2 MB) on scikit-learn's
   digits (split and shuffled as examples/digits_mlp.py), batch 32 per trainer,
   ``--dense-epochs`` epochs of each trainer's share; metric: test accuracy.
   With no SparseEmbedding, hybrid mode trains exactly as collective mode does
   (dense parameters by allreduce) and its 2 servers sit idle: it runs anyway,
   to show what the idle servers cost.
2. ctr: paramshard.models.WideDeep(criteo_schema(), dim 16, MLP 400-400-1) on the
   synthetic Criteo data of examples/ctr_wide_deep.py (its ``prepare_synthetic``:
   generate_criteo seed 0, one shard per trainer), batch 1024 per trainer,
   ``--ctr-steps`` timed steps; metric: test AUC and logloss. Sync, async and
   hybrid keep the tables on the servers (``ps.SparseEmbedding``, Adagrad lr
   0.05); collective mode has no servers, so each of the two tables (wide dim 1,
   deep dim 16) is a hashed ``torch.nn.EmbeddingBag(--buckets, dim, mode="sum")``
   that every trainer holds whole, allreduces whole every step and trains with
   the Trainer's one optimizer (Adam lr 1e-3: collective mode has no second
   optimizer for part of the dense parameters).

Everything else is the same in every mode: seeds, data, batches, steps, Adam lr
1e-3 on the dense parameters, 1 torch thread per process.

What is measured (each trainer over its own timed loop; ``--warmup`` steps before
it are not timed; data loading and process start-up are outside it):

- samples/s: each trainer's timed samples over its timed seconds, summed over trainers.
- bytes/step: bytes SENT by every process of the job over the timed loop, summed,
  divided by the steps each trainer took in it. Trainers: the bytes their TCP
  sockets sent (TCP_INFO tcpi_bytes_sent of every TCP socket of the process:
  ZeroMQ to the servers, gloo to the other trainer, the rendezvous store).
  Servers: what they sent, measured at the trainers as the bytes received on
  their connections to the servers (servers send to trainers only; their links
  to each other carry ZeroMQ heartbeats alone). Both are wire bytes, headers
  included. Also reported, as a check: the servers' own ``bytes_out`` counter
  (``trainer.server_stats()``, read by the chief before and after the loop; it
  counts array payloads only) and each trainer's /proc/self/io ``wchar`` minus
  the bytes of the launcher's progress records it printed meanwhile. ``wchar`` is
  NOT the measure: it counts write(2)/writev(2) (gloo's way) but not send(2)
  (ZeroMQ's), so it sees no byte a trainer sends to the servers.
- final metric: the chief, after a barrier at the end, pulls the final values and
  evaluates the test set, before ``trainer.close()``.

Each (workload, mode) run is a fresh ``paramshard launch`` subprocess with a
deadline; ``--repeats`` rounds run every pair once, the modes' order rotated by
one each round; the tables give medians (and min-max of samples/s).

    .venv/bin/python benchmarks/modes.py [--repeats 3] [--markdown] [--plot docs/images/modes.png]
    .venv/bin/python benchmarks/modes.py --quick          # smoke test: a few steps, 1 round
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
from ps_vs_pytorch import child_environ  # noqa: E402  (no PARAMSHARD_* for the jobs, malloc settings)

ROOT = Path(__file__).resolve().parent.parent
THIS = Path(__file__).resolve()
TRAIN = THIS.parent / "modes_train.py"
sys.path.insert(0, str(ROOT / "examples"))

TRAINERS = 2
# mode -> (servers, label)
MODES = {
    "sync": (2, "sync PS"),
    "async": (2, "async PS"),
    "collective": (0, "collective (allreduce)"),
    "hybrid": (2, "hybrid"),
}
WORKLOADS = ("dense", "ctr")
MB = 1e6


# ===================================================================== data
def prepare_ctr_data(workdir: Path, train_rows: int, test_rows: int, buckets: int) -> dict:
    """The CTR example's synthetic data (one shard per trainer, test.tsv) under ``workdir``;
    returns where it is, the hidden model's AUC and how the collective tables' hashing folds the ids."""
    from ctr_wide_deep import prepare_synthetic
    import torch

    from paramshard.data import CriteoReader
    from paramshard.models.hashed import HashedEmbeddingBag
    shards, _test, hidden_auc = prepare_synthetic(workdir, train_rows, test_rows, TRAINERS, 0)
    files = sorted(shards.glob("part-*"))
    ids = np.unique(np.concatenate([b.sparse_ids.ravel() for b in CriteoReader(files, 65536)]))
    return {"dir": shards.parent, "hidden_auc": hidden_auc, "distinct_ids": len(ids),
            # Rows of the deep table the ids land in (the wide table's salt differs: about as many).
            "buckets_used": len(np.unique(HashedEmbeddingBag("deep", buckets, 1).rows_of(torch.from_numpy(ids.view(np.int64)))))}


# ===================================================================== one run
def job_argv(workload: str, mode: str, args, data_dir: Path | None, result: Path, run_dir: Path) -> list[str]:
    servers = MODES[mode][0]
    train = [str(TRAIN), "--workload", workload, "--result", str(result), "--warmup", str(args.warmup),
             "--seed", str(args.seed)]
    if workload == "dense":
        train += ["--epochs", str(args.dense_epochs), "--batch-size", str(args.dense_batch)]
    else:
        train += ["--data", str(data_dir), "--steps", str(args.ctr_steps), "--batch-size", str(args.ctr_batch),
                  "--buckets", str(args.buckets)]
    return [sys.executable, "-m", "paramshard", "launch", "--servers", str(servers), "--trainers", str(TRAINERS),
            "--mode", mode, "--run-dir", str(run_dir), "--timeout", str(args.launch_timeout), *train]


def run_job(children: C.Children, workload: str, mode: str, args, data_dir, workdir: Path) -> dict:
    """One ``paramshard launch`` to its end or its deadline; torn down in every case."""
    result = Path(tempfile.mkdtemp(prefix=f"result-{workload}-{mode}-", dir=workdir))
    try:
        return combine(C.run_for_results(children, f"{workload} workload, {mode} mode",
                                         job_argv(workload, mode, args, data_dir, result, result / "run"),
                                         child_environ(), result, TRAINERS, args.run_timeout))
    finally:
        shutil.rmtree(result, ignore_errors=True)


def combine(trainers: list[dict]) -> dict:
    """A run's numbers: rates and bytes summed over trainers, per step of a trainer; metrics from the chief."""
    chief = next(t for t in trainers if t["trainer_id"] == 0)
    steps = chief["steps_timed"]
    if any(t["steps_timed"] != steps for t in trainers):
        raise RuntimeError(f"trainers timed different step counts: {[t['steps_timed'] for t in trainers]}")

    def per_step(values) -> float:
        return sum(values) / steps
    out = {
        "samples_per_s": sum(t["samples_per_s"] for t in trainers),
        "steps": steps, "seconds": max(t["seconds_timed"] for t in trainers),
        "trainer_sent": per_step(t["tcp"]["sent"] for t in trainers),
        "trainer_sent_servers": per_step(t["tcp"]["sent_servers"] for t in trainers),
        "server_sent": per_step(t["tcp"]["recv_servers"] for t in trainers),
        "server_payload": chief["server_bytes_out"] / steps,
        "wchar": per_step(t["wchar"] - t["stdout_bytes"] for t in trainers),
        "stdout": per_step(t["stdout_bytes"] for t in trainers),
        "dense_bytes": chief["dense_bytes"], "total_steps": chief["total_steps"],
    }
    out["bytes"] = out["trainer_sent"] + out["server_sent"]
    for key in ("accuracy", "auc", "logloss"):
        if key in chief:
            out[key] = chief[key]
    return out


# ===================================================================== report
def med(runs: list[dict], key: str) -> float:
    return C.median(r[key] for r in runs)


def workload_table(workload: str, runs: dict) -> tuple[list, list, list]:
    metric = ["test accuracy"] if workload == "dense" else ["test AUC", "test logloss"]
    headers = ["mode", "processes (servers+trainers)", "samples/s (median)", "min-max", "ratio to sync PS",
               "bytes/step (median)", "of which trainers / servers", *metric]
    base = med(runs["sync"], "samples_per_s") if runs.get("sync") else None
    rows = []
    for mode, rs in runs.items():
        servers, label = MODES[mode]
        rates = [r["samples_per_s"] for r in rs]
        row = [label, f"{servers}+{TRAINERS}", f"{C.median(rates):,.0f}", f"{min(rates):,.0f}-{max(rates):,.0f}",
               f"{C.median(rates) / base:.2f}x" if base else "-", f"{med(rs, 'bytes') / MB:.2f} MB",
               f"{med(rs, 'trainer_sent') / MB:.2f} / {med(rs, 'server_sent') / MB:.2f} MB"]
        if workload == "dense":
            row.append(f"{med(rs, 'accuracy'):.4f}")
        else:
            row += [f"{med(rs, 'auc'):.4f}", f"{med(rs, 'logloss'):.4f}"]
        rows.append(row)
    return headers, rows, [False, True, True, True, True, True, True] + [True] * len(metric)


def check_table(results: dict) -> tuple[list, list, list]:
    headers = ["workload", "mode", "trainers' TCP sent, kB", "of which to servers, kB", "servers' TCP sent, kB",
               "servers' bytes_out (payload), kB", "trainers' wchar - records, kB", "progress records, B"]
    rows = []
    for workload, runs in results.items():
        for mode, rs in runs.items():
            rows.append([workload, MODES[mode][1]]
                        + [f"{med(rs, k) / 1e3:,.1f}" for k in ("trainer_sent", "trainer_sent_servers", "server_sent",
                                                                "server_payload", "wchar")]
                        + [f"{med(rs, 'stdout'):,.0f}"])
    return headers, rows, [False, False] + [True] * 6


def report(args, results: dict, ctr_info: dict | None, command: str, note: str) -> None:
    tables = []
    for workload, runs in results.items():
        title = ("Dense MLP 64-512-512-10 on digits" if workload == "dense" else
                 "CTR WideDeep on synthetic Criteo")
        tables.append((f"{title}: the four modes (median of {args.repeats} interleaved repeats)",
                       *workload_table(workload, runs)))
    tables.append(("Bytes per step, every counter (median of repeats)", *check_table(results)))
    notes = [f"command: {command}"]
    if "dense" in results:
        r = next(iter(results["dense"].values()))[0]
        notes.append(
            f"dense: {r['dense_bytes'] / MB:.2f} MB of parameters; {args.dense_epochs} epochs, batch "
            f"{args.dense_batch} per trainer, {r['total_steps']} steps per trainer of which {args.warmup} "
            f"untimed warm-up, Adam lr 1e-3. Hybrid has no sparse table here: it is collective mode plus 2 idle "
            f"servers. Arrays alone would be 4 x {r['dense_bytes'] / MB:.2f} MB per step with servers (each "
            f"trainer pushes gradients and gets values back) and 2 x {r['dense_bytes'] / MB:.2f} MB by ring "
            f"allreduce (each trainer sends 2(n-1)/n of the parameters)")
    if ctr_info:
        coll = results.get("ctr", {}).get("collective")
        size = f"{coll[0]['dense_bytes'] / MB:.1f} MB" if coll else "?"
        notes.append(
            f"ctr: {args.ctr_train_rows:,} train rows (one shard per trainer), {args.ctr_test_rows:,} test rows; "
            f"hidden-model test AUC {ctr_info['hidden_auc']:.4f} (the ceiling); batch {args.ctr_batch} per "
            f"trainer, {args.warmup} warm-up + {args.ctr_steps} timed steps per trainer. Servers' tables: Adagrad "
            f"lr 0.05, dense part Adam lr 1e-3. Collective: 2 tables (wide dim 1, deep dim 16) of "
            f"{args.buckets:,} hashed rows = {args.buckets * 17 * 4 / MB:.1f} MB of tables, {size} of dense "
            f"parameters in all, held by every trainer, allreduced whole every step and trained by Adam lr "
            f"1e-3 (the Trainer's one optimizer); the {ctr_info['distinct_ids']:,} distinct ids of the training "
            f"data fall into {ctr_info['buckets_used']:,} buckets (per table)")
    notes.append("bytes/step: bytes sent by every process over the timed loop / steps per trainer. Trainers: "
                 "TCP_INFO bytes sent by all their TCP sockets. Servers: bytes the trainers received on their "
                 "connections to the servers. servers' bytes_out: the servers' own counter of array payloads "
                 "(read by the chief before and after the loop). wchar (/proc/self/io) minus the launcher's progress "
                 "records printed meanwhile: shown only to say why it is not used: it counts write(2)/writev(2) "
                 "(gloo) and not send(2) (ZeroMQ)")
    notes.append(note)
    if not args.markdown:
        C.emit(False, tables, notes)
        return
    print(f"```\n{command}\n```\n")
    for title, headers, rows, right in tables:      # C.emit's markdown leaves the titles out
        print(f"**{title}**\n")
        print(C.markdown_table(headers, rows, right))
        print()
    C.emit(True, [], notes)


def plot(path: Path, results: dict) -> None:
    """Two panels (dense, ctr) of samples/s per mode, bars min-max over repeats and the final
    metric written on each bar; bytes/step (trainers' + servers') in the row below."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, len(results), figsize=(5.5 * len(results), 7.5), squeeze=False)
    for col, (workload, runs) in enumerate(results.items()):
        labels = [MODES[m][1].replace(" (allreduce)", "") for m in runs]
        x = np.arange(len(runs))
        rates = [[r["samples_per_s"] for r in rs] for rs in runs.values()]
        mid = np.array([C.median(v) for v in rates])
        lo, hi = mid - np.array([min(v) for v in rates]), np.array([max(v) for v in rates]) - mid
        metric = [f"acc {med(rs, 'accuracy'):.3f}" if workload == "dense" else f"AUC {med(rs, 'auc'):.3f}"
                  for rs in runs.values()]
        ax = axes[0][col]
        ax.bar(x, mid, yerr=[lo, hi], capsize=4, color="tab:blue")
        for xi, m, h, text in zip(x, mid, hi, metric):
            ax.annotate(f"{m:,.0f}\n{text}", (xi, m + h), ha="center", va="bottom", fontsize=8,
                        xytext=(0, 2), textcoords="offset points")
        ax.set_ylim(0, max(mid + hi) * 1.22)
        ax.set_xticks(x, labels)
        ax.set_ylabel("samples/s (all trainers)")
        ax.set_title(f"{'dense MLP on digits' if workload == 'dense' else 'CTR WideDeep'}: samples/s (min-max)")
        ax = axes[1][col]
        trainer = np.array([med(rs, "trainer_sent") / MB for rs in runs.values()])
        server = np.array([med(rs, "server_sent") / MB for rs in runs.values()])
        ax.bar(x, trainer, color="tab:orange", label="sent by trainers")
        ax.bar(x, server, bottom=trainer, color="tab:green", label="sent by servers")
        for xi, t in zip(x, trainer + server):
            ax.annotate(f"{t:.2f} MB", (xi, t), ha="center", va="bottom", fontsize=8,
                        xytext=(0, 2), textcoords="offset points")
        ax.set_ylim(0, max(trainer + server) * 1.3)
        ax.set_xticks(x, labels)
        ax.set_ylabel("MB sent per step (all processes)")
        ax.set_title("bytes sent per step (median)")
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle("paramshard modes: 2 trainers, 2 servers (none in collective mode); medians of the repeats",
                 fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ===================================================================== main
def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="dense,ctr (default both)")
    p.add_argument("--modes", default=",".join(MODES), help="default: sync,async,collective,hybrid")
    p.add_argument("--dense-epochs", type=int, default=20, help="epochs of each trainer's share (default 20)")
    p.add_argument("--dense-batch", type=int, default=32, help="per trainer")
    p.add_argument("--ctr-train-rows", type=int, default=240_000)
    p.add_argument("--ctr-test-rows", type=int, default=50_000)
    p.add_argument("--ctr-batch", type=int, default=1024, help="per trainer")
    p.add_argument("--ctr-steps", type=int, default=100, help="timed steps per trainer")
    p.add_argument("--buckets", type=int, default=1 << 17, help="collective CTR: rows per hashed table")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per trainer before the timed loop")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-timeout", type=float, default=300.0, help="deadline of one run, s")
    p.add_argument("--launch-timeout", type=float, default=120.0, help="paramshard launch --timeout")
    p.add_argument("--plot", default=str(ROOT / "docs" / "images" / "modes.png"), metavar="PATH",
                   help="PNG to write (default docs/images/modes.png); '' for none")
    p.add_argument("--quick", action="store_true", help="smoke test: a few steps, small data, 1 round")
    p.add_argument("--markdown", action="store_true", help="print markdown tables for RESULTS.md")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.dense_epochs, args.warmup = 1, 2, 2
        args.ctr_train_rows, args.ctr_test_rows, args.ctr_steps = 30_000, 8192, 10
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.workloads or set(args.workloads) - set(WORKLOADS):
        p.error(f"--workloads: a list of {WORKLOADS}")
    if not args.modes or set(args.modes) - set(MODES):
        p.error(f"--modes: a list of {tuple(MODES)}")
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    if args.buckets < 1 or args.buckets & (args.buckets - 1):
        p.error(f"--buckets {args.buckets}: must be a power of two")
    need = (args.warmup + args.ctr_steps) * args.ctr_batch * TRAINERS
    if "ctr" in args.workloads and need > args.ctr_train_rows:
        p.error(f"--ctr-train-rows {args.ctr_train_rows:,}: {need:,} rows needed for "
                f"{args.warmup} + {args.ctr_steps} steps of {args.ctr_batch} on {TRAINERS} trainers")
    return args


def rotated(modes: list[str], rnd: int) -> list[str]:
    """Round ``rnd`` starts one mode later than the round before: each mode takes each place in turn."""
    k = rnd % len(modes)
    return modes[k:] + modes[:k]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    command = shlex.join([os.path.relpath(sys.executable, ROOT), os.path.relpath(THIS, ROOT), *argv])
    C.install_sigterm_as_exit()
    note = C.machine_note()
    t_start = time.monotonic()

    def log(msg):
        print(msg, file=sys.stderr, flush=True)          # progress: stdout holds only the result

    children = C.Children()
    workdir = Path(tempfile.mkdtemp(prefix="bench-modes-"))
    results: dict[str, dict[str, list]] = {w: {m: [] for m in args.modes} for w in args.workloads}
    ctr_info = None
    try:
        if "ctr" in args.workloads:
            log(f"generating {args.ctr_train_rows + args.ctr_test_rows:,} rows of synthetic Criteo data ...")
            ctr_info = prepare_ctr_data(workdir / "data", args.ctr_train_rows, args.ctr_test_rows, args.buckets)
        for rnd in range(args.repeats):
            for workload in (args.workloads if rnd % 2 == 0 else args.workloads[::-1]):
                for mode in rotated(args.modes, rnd):
                    r = run_job(children, workload, mode, args, ctr_info and ctr_info["dir"], workdir)
                    results[workload][mode].append(r)
                    metric = (f"accuracy {r['accuracy']:.4f}" if workload == "dense"
                              else f"AUC {r['auc']:.4f} logloss {r['logloss']:.4f}")
                    log(f"round {rnd + 1}/{args.repeats}: {workload:5} {mode:10} {r['samples_per_s']:9,.0f} "
                        f"samples/s  {r['bytes'] / MB:7.3f} MB/step  {metric}")
    finally:
        children.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    note += f"; load average {os.getloadavg()[0]:.2f} at end; {time.monotonic() - t_start:.0f} s"
    report(args, results, ctr_info, command, note)
    if args.plot:
        plot(Path(args.plot), results)
        log(f"plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
