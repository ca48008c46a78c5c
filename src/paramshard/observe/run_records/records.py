"""The run directory's files and the metric records in it: one format shared by the
launcher (writer), the live progress, `paramshard report` and `paramshard stats`.

A run directory (``paramshard launch --run-dir DIR``, default
``runs/YYYYmmdd-HHMMSS-JOBID/``) holds:

- ``logs/server-0.log``, ``logs/trainer-1.log`` ...: each process's own output;
- ``config.json``: the launch configuration and every rank's environment
  contract (``PARAMSHARD_SECRET`` redacted);
- ``plan.json``: what each server holds once the chief registered:
  ``{"servers": [{"server": 0, "address": ..., "dense_blocks": n, "dense_elements": n,
  "tables": {name: {"rows": n, "dim": d}}}], "dense_load_max_over_mean": x}``;
- ``metrics.jsonl``: one JSON record a line, in time order (below);
- ``summary.json`` at the end: ``{"job_id", "started", "ended" (unix seconds),
  "duration_s", "exit_code", "processes": [{"name": "trainer 0", "host": ...,
  "exit_code": int|None}], "totals": {"steps": {"0": n, ...}, "samples": n,
  "sparse_rows": n, "dense_elements": n, "requests": n, "bytes_in": n, "bytes_out": n},
  "staleness": {"max": k, "histogram": {"0": n, ...}} | None}``.

Records (every one has ``t``, unix seconds, and ``kind``):

- ``{"kind": "trainer", "trainer": 0, "step": 120, "samples": 30720,
  "samples_per_s": 1234.5, "loss": 0.45 | None, "epoch": 1 | None,
  "metrics": {user's own, from trainer.log(...): the latest value of each},
  "logged": [{"t": s, "step": n, "epoch": e | None, "values": {name: x}}, ...] (every
  trainer.log call since the previous record, with the step and epoch it was made at),
  "phases": {"pull": s, "compute": s, "push": s} (mean seconds per step since the
  trainer's previous record), "staleness_max": k | None, "step_max_s": s (the longest
  time between two consecutive step ends since the previous record: a stall on a move,
  a lost peer or an evaluation shows here), "step_end_t": unix s | None (when its last
  step ended), "done": true (only on its last record, written as it closes),
  "result": {...} (only on the record after ``trainer.log(result={...})``: the program's
  final figures, which `paramshard report` prints first)}``: a
  trainer's progress, about once a second and as it closes;
- ``{"kind": "server", "server": 0, "rows": n, "elements": n, "bytes_in": n,
  "bytes_out": n, "requests": n (cumulative over the job: a server restarted in place
  starts its own counters again from 0, and its records add what it counted before;
  observe/run_records/counter_carry.py), "restarts": n (times its counters were seen to start
  again), "uptime_s": the process's seconds up, "started_at": unix s (the process's start:
  another value, another process), "requests_per_s": x,
  "queue_s": mean seconds a request waited before its handler ran (since the
  previous record), "update_s": handler seconds per push since the previous record,
  "staleness": {"0": n, "1": n, ...} (cumulative histogram of async push staleness),
  and with memory budgets "tier": {table: {"budget": bytes, "resident_bytes": n,
  "hit_rate": x, "spills": n, "promotions": n}}, "memory_budget" and "rss_bytes"
  (a server budget), and with PARAMSHARD_DELTA_DIR "deltas": {"deltas": n, "snapshots": n,
  "bytes": n, "delta_bytes": n, "snapshot_bytes": n, "rows": n, "tombstones": n,
  "max_delta_bytes": n, "max_delta_rows": n, "last_snapshot_bytes": n, "last_snapshot_rows": n,
  "last_seq": n | None, "since_last_s": s | None, "last_publish_s": s | None} (what its delta
  publisher wrote since its process started: messages/server_stats.py DeltaStats)}``: a
  server's counters, every ``SERVER_EVERY`` seconds;
- ``{"kind": "event", "event": "start" | "end" | "failure" | "restart", "text": ...}``;
  a failure is the launcher's "first failure" summary of a run that failed, with the
  ``rank`` that failed first and the ``exit_code``; a restart also names the ``rank`` restarted ("server 1", or "job" for the whole job);
  ``scale_start`` (``servers``: the target) and ``scale_end`` (a move of sparse partitions,
  launch/server_scaling.MoveRecord: ``servers_before``, ``servers_after``, ``started``, ``ended``,
  ``seconds``, ``partitions``, ``rows``, ``bytes``, ``handoffs``, ``longest_handoff_s``,
  ``routing_version``, ``switch_step``).
  Elastic jobs add ``membership`` (``role``, ``rank``, ``change``, ``live``) and ``scale``
  (``trainers``: the count asked for) events, and with bounded-loss recovery the replica
  keeper's ``replica`` events (``what``: first, refreshes, lost, restored with ``recovery_s``,
  ``copy_age_s``, ``updates_lost_estimate``); observe/run_records/elastic_view.py reads them for the report.

- ``{"kind": "geo_round", "trainer": 0, "step": n, "k": n, "next_k": n, "bytes": n, "wire_s": s,
  "compute_s": s, "staleness": steps, "delta_norm", "value_norm", "drift_norm", "settled_value_norm",
  "settled_drift_norm"}``: one round of a
  GEO trainer (``--mode geo``: k local steps, then the send), written by geo/records.py and read
  by observe/run_records/geo_view.py for the report's GEO section.

Staleness of an async push: how many updates the server applied to what the
gradient was computed from between the trainer's read and the push (0: nothing
moved in between). Sync pushes have none.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Iterator

from paramshard.safe_files import open_append, write_whole

SERVER_EVERY = 2.0           # seconds between server records
TRAINER_EVERY = 1.0          # seconds between a trainer's records
MARK = "\x1eparamshard-metrics "   # a trainer's record on its stdout, for the launcher to take out
# The run directory's control folder (`paramshard scale` -> the launcher: launch/elastic/control_channel.py)
# and, in it, the launcher's "no more requests" mark: named here, with the rest of the run
# directory's layout, so observe/ reads them without importing the launcher.
CONTROL = "control"
ENDED = "ended.json"           # in control/: the launcher answers no more requests (why, when)


def default_run_dir(job_id: str, now: float | None = None) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now or time.time()))
    return Path("runs") / f"{stamp}-{job_id}"


class RecordWriter:
    """Appends records to ``metrics.jsonl``, one line each, from any thread."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open_append(self.path)       # never through a link planted in its place
        self._lock = threading.Lock()

    def write(self, record: dict) -> None:
        record.setdefault("t", time.time())
        line = json.dumps(record, separators=(",", ":"), default=float) + "\n"
        with self._lock:
            if not self._file.closed:
                self._file.write(line)

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_records(path: Path) -> Iterator[dict]:
    """Records of a metrics.jsonl; a torn last line (a run still being written) is skipped."""
    with open(path) as f:
        for line in f:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def write_json(path: Path, data) -> None:
    """``data`` into ``path`` whole: a new file (O_EXCL, no link followed) renamed into place."""
    write_whole(path, json.dumps(data, indent=1, default=float) + "\n")
