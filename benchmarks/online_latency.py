"""Event to servable: how long after an event is appended a served prediction reflects it.

The whole online loop on this machine, as a user runs it (docs/online.md):

1. this process appends the demo's synthetic Criteo events (`paramshard gen-data`'s hidden model)
   as CSV lines to ``DIR/live/`` at ``--rate`` events/s (paramshard.data.stream.replay);
2. `paramshard launch --servers 1 --trainers 1 --mode async --deltas DIR/deltas -m
   paramshard.apps.ctr --stream DIR/live ...` trains on them as they come (DeepFM) and its server
   publishes a delta every PARAMSHARD_DELTA_SECONDS (``--delta-seconds``);
3. `paramshard serve DIR/deltas` follows the deltas and answers predictions over HTTP.

Once the serving process answers (its start is not the loop's latency), every ``--probe-every``
seconds the writer appends a *probe*: an event whose 26 categorical
values were never seen (so its 26 ids are new to the tables), and notes the time it became
visible (t0). A client asks the serving process for the probe's prediction every 10 ms; each
reply names the model version that answered ({server: seq}). After the run, the delta files say
which seq first held the probe's rows (its ids in a table: trained), so the probe's latency is
the time of the first reply answered by that seq or a later one, minus t0: appended -> read ->
trained -> published -> applied -> answered. Also reported per probe: when that delta was
written (``created``: appended -> published). p50/p95/max over the probes.

    PYTHONPATH=src python benchmarks/online_latency.py --seconds 60
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from _common import install_sigterm_as_exit  # noqa: E402


def percentile(values, q):
    return float(np.percentile(values, q)) if values else float("nan")


class Prober:
    """Asks the serving process for each probe's prediction until a reply's version is past
    the probe's delta (known only afterwards: it records every reply's time and version)."""

    def __init__(self, port: int, row_of: dict):
        self.port, self.row_of = port, row_of
        self.replies: dict[int, list[tuple[float, int]]] = {}      # probe -> [(time, seq of server 0)]
        self.active: dict[int, float] = {}                          # probe -> stop asking at
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def add(self, probe: int, until: float) -> None:
        with self.lock:
            self.active[probe] = until
            self.replies[probe] = []

    def run(self) -> None:
        conn = None
        while not self.stop.is_set():
            with self.lock:
                now = time.time()
                probes = [p for p, until in self.active.items() if until > now]
            if not probes:
                time.sleep(0.01)
                continue
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                for probe in probes:
                    conn.request("POST", "/predict", json.dumps({"rows": [self.row_of[probe]]}),
                                 {"Content-Type": "application/json"})
                    reply = json.loads(conn.getresponse().read())
                    seq = int(reply["version"]["servers"].get("0", -1))
                    self.replies[probe].append((time.time(), seq))
            except (OSError, http.client.HTTPException, KeyError, ValueError):
                conn = None                     # the server is starting: ask again
                time.sleep(0.05)
                continue
            time.sleep(0.01)


def wait_healthy(port: int, serve, timeout: float = 120.0) -> None:
    """Returns once ``serve`` answers /health with a model (or it died, or the deadline passed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and serve.poll() is None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(0.2)


def first_seq_holding(deltas_dir: Path, ids: np.ndarray) -> dict:
    """For each delta of server 0: its seq, created time and whether it holds any of ``ids``."""
    from paramshard.online.delta_format import read_delta
    from paramshard.online.delta_log import DeltaLog
    found = []
    for entry in DeltaLog(deltas_dir).entries(0):
        if entry.kind != "delta":
            continue
        d = read_delta(entry.path)
        held = any(np.isin(ids, t.ids).any() for t in d.tables.values())
        found.append((entry.seq, d.created, held))
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=60.0, help="how long events are appended")
    p.add_argument("--rate", type=float, default=2000.0, help="events per second appended")
    p.add_argument("--probe-every", type=float, default=1.5)
    p.add_argument("--delta-seconds", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--model", default="deepfm")
    p.add_argument("--port", type=int, default=18181)
    p.add_argument("--dir", default=None, help="work directory (default: a temporary one, removed)")
    args = p.parse_args()
    install_sigterm_as_exit()

    import pandas as pd
    from paramshard.data.features.encode import Encoder
    from paramshard.data.features.presets import criteo_schema
    from paramshard.data.stream.replay import DirectoryAppender
    from paramshard.data.synthetic import generate_criteo

    work = Path(args.dir or tempfile.mkdtemp(prefix="online-latency-"))
    work.mkdir(parents=True, exist_ok=True)
    schema = criteo_schema()
    schema.save(work / "schema.json")
    events_n = int(args.rate * args.seconds) + 1
    generate_criteo(work / "events.tsv", events_n, seed=7)
    names = schema.format.names
    events = pd.read_csv(work / "events.tsv", sep="\t", header=None, names=names, dtype=str, keep_default_na=False)
    encoder = Encoder(schema)
    env = dict(os.environ, PARAMSHARD_DELTA_SECONDS=str(args.delta_seconds),
               PARAMSHARD_DELTA_SNAPSHOT_EVERY="100000")   # keep every delta: the analysis reads them
    py = sys.executable
    job = subprocess.Popen([py, "-m", "paramshard", "launch", "--servers", "1", "--trainers", "1", "--mode", "async",
                            "--deltas", str(work / "deltas"), "-m", "paramshard.apps.ctr", "--stream",
                            str(work / "live"), "--schema", str(work / "schema.json"), "--model", args.model,
                            "--batch-size", str(args.batch_size), "--max-seconds", str(args.seconds + 20)],
                           cwd=work, env=env, stdout=open(work / "job.log", "w"), stderr=subprocess.STDOUT,
                           start_new_session=True)
    serve = None
    appender = DirectoryAppender(work / "live", "csv", file_rows=10**9)
    probes: dict[int, dict] = {}
    row_of: dict[int, dict] = {}
    prober = Prober(args.port, row_of)
    thread = threading.Thread(target=prober.run, daemon=True)
    try:
        deadline = time.monotonic() + 120
        while not (work / "deltas" / "model.pt").exists():
            if job.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the job ended or wrote no model.pt: {(work / 'job.log').read_text()[-2000:]}")
            appender.append(events.iloc[:1])            # the trainer starts on the first events
            time.sleep(0.5)
        serve = subprocess.Popen([py, "-m", "paramshard", "serve", str(work / "deltas"), "--port", str(args.port)],
                                 cwd=work, stdout=open(work / "serve.log", "w"), stderr=subprocess.STDOUT,
                                 start_new_session=True)
        thread.start()
        rng = np.random.default_rng(11)
        start, written, chunk = time.monotonic(), 1, max(1, int(args.rate / 10))
        next_probe = float("inf")        # probes once the serving process answers: steady state, not its start
        ready = threading.Thread(target=wait_healthy, args=(args.port, serve), daemon=True)
        ready.start()
        while time.monotonic() - start < args.seconds and written < len(events):
            appender.append(events.iloc[written:written + chunk])
            written += chunk
            if next_probe == float("inf") and not ready.is_alive():
                next_probe = time.monotonic() + 2
            if time.monotonic() >= next_probe:
                next_probe += args.probe_every
                probe = pd.DataFrame([events.iloc[written % len(events)].to_dict()])
                for c in names[14:]:
                    probe[c] = secrets.token_hex(4)                 # 26 values no event had
                probe["label"] = str(int(rng.random() < 0.5))
                batch, _ = encoder.encode({c: probe[c].to_numpy() for c in names})
                k = len(probes)
                row = {c: probe[c].iloc[0] for c in names if c != "label"}
                row_of[k] = row
                appended = appender.append(probe)[-1]
                probes[k] = {"t0": appended.at, "ids": batch.ids.reshape(-1).view(np.uint64)}
                prober.add(k, appended.at + 30)
            time.sleep(max(0.0, start + written / args.rate - time.monotonic()))
        time.sleep(max(10.0, 5 * args.delta_seconds))        # the last probes' deltas
    finally:
        prober.stop.set()
        for proc in (serve, job):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, 15)
        for proc in (serve, job):
            if proc is not None:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, 9)
    latencies, published, per_probe = [], [], []
    for k, probe in probes.items():
        deltas = first_seq_holding(work / "deltas", probe["ids"])
        first = next(((seq, created) for seq, created, held in deltas if held), None)
        if first is None:
            print(f"probe {k}: in no delta (not trained before the job stopped)")
            continue
        seq, created = first
        answered = next((t for t, s in prober.replies[k] if s >= seq), None)
        published.append(created - probe["t0"])
        per_probe.append((k, created - probe["t0"]))
        if answered is None:
            print(f"probe {k}: trained into delta {seq}, never answered by it (the server stopped first?)")
            continue
        latencies.append(answered - probe["t0"])
        per_probe[-1] += (answered - probe["t0"],)
    log = (work / "job.log").read_text()
    rate_line = [line for line in log.splitlines() if "progressive AUC" in line][-1:] or ["(no progressive line)"]
    print(f"online loop: {args.model}, 1 server + 1 trainer (async), events appended at {args.rate:g}/s for "
          f"{args.seconds:g} s, a delta every {args.delta_seconds:g} s")
    print(f"  trainer: {rate_line[0].split('|', 1)[-1].strip()}")
    print(f"  probes: {len(probes)}, answered: {len(latencies)}")
    print(f"  appended -> published (delta written): p50 {percentile(published, 50):.2f} s  "
          f"p95 {percentile(published, 95):.2f} s  max {max(published, default=float('nan')):.2f} s")
    print(f"  appended -> servable (a reply by that delta): p50 {percentile(latencies, 50):.2f} s  "
          f"p95 {percentile(latencies, 95):.2f} s  max {max(latencies, default=float('nan')):.2f} s")
    if latencies:
        print(f"  goal p95 <= 5 s: {'met' if percentile(latencies, 95) <= 5 else 'NOT met'}"
              f" (median of the probes {statistics.median(latencies):.2f} s)")
    print("  per probe (in order appended; published, servable):",
          " ".join(f"{p[1]:.1f}/{p[2]:.1f}" if len(p) > 2 else f"{p[1]:.1f}/-" for p in per_probe))
    print(f"  work directory: {work}")


if __name__ == "__main__":
    main()
