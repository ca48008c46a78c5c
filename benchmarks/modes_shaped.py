"""The modes on rate-limited links: 2 servers + 2 trainers of the CTR demo, each rank on its
own network-namespace host whose link carries R bit/s each way (tests/engines/shaped.py).

Layout: a ShapedLab of 5 hosts on one bridge. Host 0 runs ``paramshard launch --hosts``
(unshaped: it carries only the launcher's ssh control and the ranks' output); hosts 1, 2 run
the servers, hosts 3, 4 the trainers, each shaped to the rate under test (tbf both ways:
what a host sends and what it receives). One sshd per namespace (tests/engines/sshd.py),
ranks reach each other at the lab's addresses. The training script is
benchmarks/modes_train.py's CTR workload (WideDeep dim 16 on examples/ctr_wide_deep.py's
synthetic Criteo data, batch 1024 per trainer, Adagrad on the tables and Adam on the dense
part), unchanged: the same as benchmarks/modes.py's unshaped comparison.

A mode spec becomes launch flags: ``sync`` -> ``--mode sync``; ``geo:8`` -> ``--mode geo
--geo-k 8``; ``geo:auto`` -> ``--mode geo --geo-k auto``; a third part is the GEO send,
``geo:64:blocking`` -> ``--mode geo --geo-k 64 --geo-send blocking`` (unset: the launcher's
default, overlapped); ``--launch-args`` adds flags to every
job (e.g. ``'--max-staleness 64'``). A run that fails (e.g. a mode the
launcher does not know) is a failed cell with the launcher's reason, not a crash.

What is measured, per run (medians over ``--repeats`` interleaved rounds: the rates' and the
modes' orders rotated by one each round):

- samples/s: each trainer's timed samples over its timed seconds, summed (modes_train.py).
- wire bytes/sample: bytes the 4 rank hosts put on their links (bridge-port counters,
  headers and every protocol included, sampled every 0.25 s and interpolated) over the
  trainers' timed window, divided by the samples the trainers timed in it.
- TCP bytes/sample: modes_train.py's own count (TCP_INFO of the trainers' sockets), as a check.
- busiest link: the fullest rank host's link over the window (the larger direction), as a
  share of the nominal rate: near 100% the link limits the job, well below it CPU or round trips do.
- test AUC: the chief's, on the test set, after the closing barrier.
- time to a target AUC: trainer 0 evaluates its model on a held-out set (the first
  ``--eval-rows`` test rows) every ``--eval-every`` timed steps, every trainer's clock stopped
  meanwhile (modes_train.py's Curve says what is evaluated and how the pause is counted:
  it is off the samples/s clock, off the time-to-AUC clock, and its link bytes are off the
  wire counts); the time to a target is trainer 0's timed seconds at which the curve first
  reaches it, interpolated linearly between the two points around the crossing. The target:
  ``--target-auc``, else sync's median last held-out AUC minus ``--target-margin`` (0.002).
- raw tbf: before each rate's runs of a round, one TCP transfer from host 1 to host 3 (about
  1 s of the rate's bytes) says what the shaped link actually delivers (at 10 Gbit/s this
  2-core machine's CPU may be the limit, not the shaping).

Needs root (namespaces, tc), sshd/ssh (scripts/install-test-engines.sh) and tbf; netem (latency)
is not in this kernel, so the links have the veth's microseconds of latency.

    sudo .venv/bin/python benchmarks/modes_shaped.py --rates 100mbit,1gbit,10gbit \\
        --modes sync,async,geo:8,geo:64,geo:auto --repeats 3 [--markdown]
"""
from __future__ import annotations

import argparse
import math
import os
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
from modes import combine, prepare_ctr_data  # noqa: E402
from ps_vs_pytorch import child_environ  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TRAIN = Path(__file__).resolve().parent / "modes_train.py"
TRAINERS, SERVERS = 2, 2
SUBNET = "10.213.33.0/24"
LAUNCH_HOST, SERVER_HOSTS, TRAINER_HOSTS = 0, (1, 2), (3, 4)
RANK_HOSTS = (*SERVER_HOSTS, *TRAINER_HOSTS)


def mode_flags(spec: str) -> list[str]:
    """``sync`` -> [--mode, sync]; ``geo:K`` -> [--mode, geo, --geo-k, K]; ``geo:K:SEND`` adds
    [--geo-send, SEND]."""
    mode, _, rest = spec.partition(":")
    k, _, send = rest.partition(":")
    return ["--mode", mode, *(["--geo-k", k] if k else []), *(["--geo-send", send] if send else [])]


def rotated(items: list, rnd: int) -> list:
    return items[rnd % len(items):] + items[:rnd % len(items)]


def remote_python(workdir: Path) -> str:
    """The ranks' interpreter: this one with this tree's sources first (ssh passes no
    PYTHONPATH), so the job runs the code the benchmark was started from."""
    path = workdir / "python.sh"
    path.write_text(f"#!/bin/sh\nexport PYTHONPATH={shlex.quote(str(ROOT / 'src'))}${{PYTHONPATH:+:$PYTHONPATH}}\n"
                    f"exec {shlex.quote(sys.executable)} \"$@\"\n")
    path.chmod(0o755)
    return str(path)


def job_argv(lab, hosts, spec: str, args, data_dir: Path, result: Path, python: str) -> list[str]:
    addr = lab.addresses
    return [python, "-m", "paramshard", "launch", "--servers", str(SERVERS), "--trainers", str(TRAINERS),
            *mode_flags(spec), *shlex.split(args.launch_args), "--hosts", ",".join(addr[i] for i in RANK_HOSTS),
            "--server-hosts", ",".join(addr[i] for i in SERVER_HOSTS),
            "--trainer-hosts", ",".join(addr[i] for i in TRAINER_HOSTS),
            "--ssh-config", hosts.ssh_config, "--remote-python", python, "--workspace", str(ROOT),
            "--run-dir", str(result / "run"), "--timeout", str(args.launch_timeout),
            str(TRAIN), "--workload", "ctr", "--result", str(result), "--warmup", str(args.warmup),
            "--seed", str(args.seed), "--data", str(data_dir), "--steps", str(args.ctr_steps),
            "--batch-size", str(args.ctr_batch), "--eval-every", str(args.eval_every),
            "--eval-rows", str(args.eval_rows)]


def run_one(children, lab, hosts, spec: str, rate: str, args, data_dir, workdir, python) -> dict:
    """One job on the shaped lab; its numbers, or {'error': why}."""
    from tests.engines.shaped import CounterSampler
    result = Path(tempfile.mkdtemp(prefix=f"result-{spec.replace(':', '-')}-{rate}-", dir=workdir))
    try:
        argv = lab.argv(LAUNCH_HOST, job_argv(lab, hosts, spec, args, data_dir, result, python))
        env = child_environ()
        env["PYTHONPATH"] = str(ROOT / "src")
        with CounterSampler(lab, interval=0.25) as sampler:
            trainers = C.run_for_results(children, f"{spec} at {rate}", argv, env, result, TRAINERS,
                                         args.run_timeout)
        out = combine(trainers)
        chief = next(t for t in trainers if t["trainer_id"] == 0)
        out["curve"] = chief.get("curve", [])
        out["k_trace"] = geo_k_trace(result / "run")
        if args.keep:
            keep_records(result / "run", Path(args.keep) / f"{spec.replace(':', '-')}-{rate}-{time.strftime('%H%M%S')}")
        t0 = min(t["window"][0] for t in trainers)
        t1 = max(t["window"][1] for t in trainers)
        pauses = [p["wall"] for p in out["curve"]]     # evaluation pauses: off the wire counts

        def between(hosts, key) -> float:
            return sampler.between(t0, t1, hosts, key) - sum(sampler.between(a, b, hosts, key) for a, b in pauses)
        samples = sum(t["samples_timed"] for t in trainers)
        out["wire_per_sample"] = between(RANK_HOSTS, "tx_bytes") / samples
        out["tcp_per_sample"] = out["bytes"] * out["steps"] / samples
        # How full the busiest link was (either direction), against its nominal rate: near 100%
        # the link is the limit; well below it, CPU or round trips are.
        span = (t1 - t0) - sum(b - a for a, b in pauses)
        use = {h: max(between([h], k) for k in ("tx_bytes", "rx_bytes")) * 8
               / (span * lab.rates[h]) for h in RANK_HOSTS}
        busiest = max(use, key=use.get)
        out["link_use"], out["busiest"] = use[busiest], "server" if busiest in SERVER_HOSTS else "trainer"
        return out
    except Exception as exc:  # noqa: BLE001 - a failed cell, reported as such
        text = str(exc)
        # The launcher's reason is its last error line (usage errors: "error: ...").
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        reason = next((ln for ln in reversed(lines) if "error" in ln.lower()), lines[0] if lines else repr(exc))
        return {"error": reason[:200], "detail": text}
    finally:
        shutil.rmtree(result, ignore_errors=True)


def geo_k_trace(run_dir: Path) -> list[int]:
    """Trainer 0's k, round by round, from the run directory's geo_round records (empty: not GEO)."""
    import json
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    ks = []
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("kind") == "geo_round" and r.get("trainer") == 0:
            ks.append(int(r["k"]))
    return ks


def keep_records(run_dir: Path, dest: Path) -> None:
    """``--keep``: the run directory's records (metrics.jsonl: geo_round and progress), for analysis."""
    src = run_dir / "metrics.jsonl"
    if src.exists():
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dest / "metrics.jsonl")


def time_to(curve: list[dict], target: float) -> float:
    """Trainer 0's timed seconds when the held-out AUC first reaches ``target`` (linear between the
    points around the crossing; from 0 s at the first point), or inf: never reached."""
    before = None
    for point in curve:
        if point["auc"] >= target:
            if before is None or point["auc"] == before["auc"]:
                return point["seconds"]
            f = (target - before["auc"]) / (point["auc"] - before["auc"])
            return before["seconds"] + f * (point["seconds"] - before["seconds"])
        before = point
    return math.inf


def target_of(args, results: dict, rate: str) -> float | None:
    """The AUC the time-to-AUC column aims at, at this rate: --target-auc, else sync's median last
    held-out AUC - --target-margin; None: neither (no sync runs with a curve)."""
    if args.target_auc is not None:
        return args.target_auc
    finals = [r["curve"][-1]["auc"] for r in results[rate].get("sync", []) if "error" not in r and r["curve"]]
    return C.median(finals) - args.target_margin if finals else None


def raw_transfer(lab, rate: str) -> float:
    """What the shaped link delivers: one ~1 s TCP transfer host 1 -> host 3, payload bits/s."""
    from tests.engines.shaped import parse_rate
    nbytes = int(min(parse_rate(rate) / 8, 1.5e9))
    return lab.transfer(SERVER_HOSTS[0], TRAINER_HOSTS[0], nbytes, timeout=120)["bits_per_s"]


# ===================================================================== report
def fmt_bytes(b: float) -> str:
    return f"{b / 1e3:,.1f} kB" if b < 1e6 else f"{b / 1e6:,.2f} MB"


def table(args, results: dict, raw: dict) -> tuple[str, list, list, list]:
    headers = ["link (each host)", "tbf delivered (raw TCP)", "mode", "samples/s (median)", "min-max",
               "wire bytes/sample", "TCP bytes/sample", "busiest link", "test AUC", "runs ok",
               "held-out AUC (last)", "time to target AUC, s (median, min-max)"]
    rows = []
    for rate in args.rates:
        target = target_of(args, results, rate)
        got = [b / 1e6 for b in raw.get(rate, [])]
        delivered = (f"{C.median(got):,.0f} ({min(got):,.0f}-{max(got):,.0f}) Mbit/s" if len(got) > 1 else
                     f"{got[0]:,.0f} Mbit/s" if got else "-")
        for spec in args.modes:
            runs = results[rate][spec]
            ok = [r for r in runs if "error" not in r]
            cells = [rate, delivered, spec]
            if not ok:
                cells += [f"FAILED: {runs[0]['error']}" if runs else "not run", "", "", "", "", "", f"0/{len(runs)}",
                          "", ""]
            else:
                rates = [r["samples_per_s"] for r in ok]
                cells += [f"{C.median(rates):,.0f}", f"{min(rates):,.0f}-{max(rates):,.0f}",
                          fmt_bytes(C.median(r["wire_per_sample"] for r in ok)),
                          fmt_bytes(C.median(r["tcp_per_sample"] for r in ok)),
                          f"{C.median(r['link_use'] for r in ok):.0%} "
                          f"({'/'.join(sorted({r['busiest'] for r in ok}))})",
                          f"{C.median(r['auc'] for r in ok):.4f}", f"{len(ok)}/{len(runs)}"]
                cells += [held_out(ok), reach(ok, target)]
            rows.append(cells)
    return (f"CTR WideDeep, 2 servers + 2 trainers, one rank per shaped host (median of {args.repeats} "
            f"interleaved repeats)", headers, rows, [False, True, False, True, True, True, True, True, True, True,
                                                     True, True])


def held_out(ok: list[dict]) -> str:
    lasts = [r["curve"][-1]["auc"] for r in ok if r["curve"]]
    return f"{C.median(lasts):.4f}" if lasts else "-"


def reach(ok: list[dict], target: float | None) -> str:
    """Median time to ``target`` over the runs (a run that never reached it counts as infinite)."""
    if target is None or not all(r["curve"] for r in ok):
        return "-"
    times = [time_to(r["curve"], target) for r in ok]
    reached = [t for t in times if math.isfinite(t)]
    mid = C.median(times)
    if not math.isfinite(mid):
        return f"not reached ({len(reached)}/{len(times)} runs did)"
    return f"{mid:.1f} ({min(reached):.1f}-{max(times):.1f})" + ("" if len(reached) == len(times)
                                                                 else f", {len(reached)}/{len(times)} runs")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="100mbit,1gbit,10gbit", help="per host, tc units (default 100mbit,1gbit,10gbit)")
    p.add_argument("--modes", default="sync,async,geo:8,geo:64,geo:auto",
                   help="mode specs: MODE or MODE:GEO_K (default sync,async,geo:8,geo:64,geo:auto)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--ctr-train-rows", type=int, default=240_000)
    p.add_argument("--ctr-test-rows", type=int, default=50_000)
    p.add_argument("--ctr-batch", type=int, default=1024, help="per trainer")
    p.add_argument("--ctr-steps", type=int, default=100, help="timed steps per trainer")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per trainer before the timed loop")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-timeout", type=float, default=600.0, help="deadline of one run, s")
    p.add_argument("--launch-timeout", type=float, default=120.0, help="paramshard launch --timeout")
    p.add_argument("--launch-args", default="", metavar="'FLAGS'",
                   help="more `paramshard launch` flags for every job, one string (e.g. '--max-staleness 64')")
    p.add_argument("--eval-every", type=int, default=10,
                   help="a held-out AUC every N timed steps, off the clock, for the time to a target AUC (default "
                        "10; 0: none)")
    p.add_argument("--eval-rows", type=int, default=20_000, help="held-out rows: the first N test rows (default 20,000)")
    p.add_argument("--target-auc", type=float, default=None,
                   help="the time-to-AUC column's target (default: sync's median last held-out AUC - --target-margin)")
    p.add_argument("--target-margin", type=float, default=0.002, help="see --target-auc (default 0.002)")
    p.add_argument("--keep", default="", metavar="DIR",
                   help="copy each run's records (run/metrics.jsonl: geo_round, progress) into DIR/<mode>-<rate>-<time>")
    p.add_argument("--markdown", action="store_true", help="print a markdown table for RESULTS.md")
    args = p.parse_args(argv)
    args.rates = [r for r in args.rates.split(",") if r]
    args.modes = [m for m in args.modes.split(",") if m]
    from tests.engines.shaped import parse_rate
    for r in args.rates:
        parse_rate(r)   # a bad rate fails here, not after the data is made
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if os.geteuid() != 0:
        raise SystemExit("modes_shaped.py needs root: network namespaces and tc (run it as root)")
    from tests.engines.sshd import SshHosts
    from tests.engines.shaped import ShapedLab
    C.install_sigterm_as_exit()
    command = "sudo .venv/bin/python benchmarks/modes_shaped.py " + shlex.join(sys.argv[1:] if argv is None else argv)

    def log(msg):
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="bench-modes-shaped-"))
    children = C.Children()
    results = {rate: {spec: [] for spec in args.modes} for rate in args.rates}
    raw: dict[str, list[float]] = {rate: [] for rate in args.rates}
    try:
        log("preparing the CTR data")
        info = prepare_ctr_data(workdir / "data", args.ctr_train_rows, args.ctr_test_rows, 1 << 17)
        python = remote_python(workdir)
        with ShapedLab(1 + len(RANK_HOSTS), SUBNET) as lab, \
                SshHosts.in_lab(lab, workdir=workdir / "sshd") as hosts:
            for rnd in range(args.repeats):
                for rate in rotated(args.rates, rnd):
                    lab.shape(rate, hosts=RANK_HOSTS)
                    raw[rate].append(raw_transfer(lab, rate))
                    log(f"round {rnd + 1}/{args.repeats}, {rate}: raw TCP {raw[rate][-1] / 1e6:,.0f} Mbit/s")
                    for spec in rotated(args.modes, rnd):
                        r = run_one(children, lab, hosts, spec, rate, args, info["dir"], workdir, python)
                        results[rate][spec].append(r)
                        if "error" in r:
                            log(f"  {spec}: FAILED: {r['error']}")
                        else:
                            log(f"  {spec}: {r['samples_per_s']:,.0f} samples/s, wire "
                                f"{fmt_bytes(r['wire_per_sample'])}/sample, busiest link {r['link_use']:.0%} "
                                f"({r['busiest']}), "
                                f"AUC {r['auc']:.4f}; held-out (s, AUC): "
                                + " ".join(f"{p['seconds']:.1f}:{p['auc']:.4f}" for p in r["curve"])
                                + (f"; k: {r['k_trace']}" if r["k_trace"] else ""))
    finally:
        children.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    notes = [f"command: {command}",
             f"data: {args.ctr_train_rows:,} train rows (one shard per trainer), {args.ctr_test_rows:,} test rows, "
             f"hidden-model test AUC {info['hidden_auc']:.4f} (the ceiling); batch {args.ctr_batch} per trainer, "
             f"{args.warmup} warm-up + {args.ctr_steps} timed steps per trainer",
             "layout: launcher on an unshaped host; servers on hosts 1-2, trainers on hosts 3-4, each shaped both "
             "ways (tbf); no latency (netem is not in this kernel)",
             "wire bytes/sample: the rank hosts' link tx bytes over the trainers' timed window / samples timed; "
             "TCP bytes/sample: modes_train.py's TCP_INFO count, as a check; both without the evaluation pauses",
             f"held-out AUC: trainer 0's model on the first {args.eval_rows:,} test rows every {args.eval_every} timed "
             f"steps, every trainer's clock stopped meanwhile (modes_train.py Curve); time to target: trainer 0's "
             f"timed seconds when it first reached "
             + (f"{args.target_auc:.4f}" if args.target_auc is not None else
                f"sync's median last held-out AUC - {args.target_margin}: "
                + ", ".join(f"{r}: {t:.4f}" for r in args.rates if (t := target_of(args, results, r)) is not None)),
             "busiest link: the fullest rank host's link (the larger of its two directions) over the timed window, "
             "as a share of the nominal rate, and whose host it was; near 100% the link is the limit",
             "tbf delivered: payload rate of one TCP transfer between two shaped hosts before each rate's runs, "
             "median (min-max) over the rounds"]
    failed = {f"{spec} at {rate}": runs[0]["detail"] for rate, by in results.items() for spec, runs in by.items()
              if runs and all("error" in r for r in runs)}
    for cell, detail in failed.items():
        print(f"--- {cell} failed; last lines:\n" + "\n".join(detail.splitlines()[-6:]), file=sys.stderr)
    title, headers, rows, right = table(args, results, raw)
    if args.markdown:
        print(f"```\n{command}\n```\n\n**{title}**\n")
    C.emit(args.markdown, [(title, headers, rows, right)], notes)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        traceback.print_exc()
        sys.exit(1)
