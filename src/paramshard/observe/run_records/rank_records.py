"""Run directories without a launcher (``paramshard run --run-dir DIR`` under mpirun,
srun, torchrun, Kubernetes): each rank writes its own files into DIR, which the
engine's nodes share (a cluster file system, a volume):

- ``ranks/<name>.json``: the rank's contract (secret redacted), host and pid;
- ``metrics/trainer-N.jsonl``: the trainer's records (the same records the
  launcher collects from stdout);
- ``metrics/server-N.jsonl``: the server's records every ``SERVER_EVERY`` s,
  from the snapshot its loop refreshes (``ParameterServer.cached_stats``);
- ``summary.json``: written by server 0 when it stops (its exit code, the
  duration, totals from the last records it saw in ``metrics/``); a job in
  collective mode has no server and so no summary (``paramshard report`` draws
  the records without one).
Logs stay with the engine (``srun --output``, ``mpirun --output-filename``,
``kubectl logs``). `paramshard report` merges ``metrics/*.jsonl``.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

from paramshard.safe_files import make_private_dir
from paramshard.messages.server_stats import ServerStats
from paramshard.observe.live.monitor import server_record
from paramshard.observe.run_records.counter_carry import carry_series
from paramshard.observe.run_records.records import SERVER_EVERY, RecordWriter, write_json
from paramshard.observe.live.tensorboard_writer import TENSORBOARD_DIR, TensorBoardWriter

PREFIX = "dir:"


def run_dir_of(env) -> Path | None:
    records = getattr(env, "records", None) or ""
    return Path(records[len(PREFIX):]) if records.startswith(PREFIX) else None


def write_rank(run_dir: Path, name: str, env) -> None:
    environ = {k: ("<redacted>" if "SECRET" in k else v) for k, v in env.to_environ().items()}
    make_private_dir(run_dir)        # like `paramshard launch`'s: the user's own, writable by nobody else
    (run_dir / "ranks").mkdir(parents=True, exist_ok=True)
    write_json(run_dir / "ranks" / f"{name.replace(' ', '-')}.json",
               {"name": name, "host": socket.gethostname(), "pid": os.getpid(), "environ": environ})


class TrainerSink:
    """An ``emit`` for TrainerRecords: append to metrics/trainer-N.jsonl and the same record to
    tensorboard/trainer-N/ (observe/live/tensorboard_writer.py)."""

    def __init__(self, run_dir: Path, trainer_id: int):
        make_private_dir(run_dir)
        self.records = RecordWriter(run_dir / "metrics" / f"trainer-{trainer_id}.jsonl")
        self.tensorboard = TensorBoardWriter(run_dir / TENSORBOARD_DIR)

    def __call__(self, record: dict) -> None:
        self.records.write(record)
        self.tensorboard.write(record)

    def close(self) -> None:
        self.records.close()
        self.tensorboard.close()


class ServerRecorder:
    def __init__(self, run_dir: Path, server, every: float = SERVER_EVERY):
        self.run_dir, self.server, self.every = run_dir, server, every
        self.writer = RecordWriter(run_dir / "metrics" / f"server-{server.server_id}.jsonl")
        self.tensorboard = TensorBoardWriter(run_dir / TENSORBOARD_DIR)
        self.started = time.time()
        self._before: tuple[ServerStats | None, float | None] = (None, None)
        self._last: dict | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="server-records", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.record()

    def record(self, wire: dict | None = None) -> None:
        """A record from ``wire`` (a ``stats`` reply), else from the loop's cached snapshot."""
        wire = wire or self.server.cached_stats()[0]
        if not wire:
            return
        stats = ServerStats.from_wire(wire)
        now = time.time()
        self._last = server_record(stats, self._before[0], now, self._before[1])
        self.writer.write(self._last)
        self.tensorboard.write(self._last)
        self._before = (stats, now)

    def close(self, exit_code: int) -> None:
        """The last record (the loop has stopped: its live counters are safe to read now)."""
        self._stop.set()
        self._thread.join(timeout=5)
        self.record(self.server.snapshot_stats())
        self.writer.close()
        self.tensorboard.close()
        if self.server.server_id == 0:
            self._summary(exit_code)

    def _summary(self, exit_code: int) -> None:
        series: dict[tuple, list[dict]] = {}
        for path in sorted((self.run_dir / "metrics").glob("*.jsonl")):
            for line in path.read_text().splitlines():
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(r, dict):
                    series.setdefault((r.get("kind"), r.get("trainer", r.get("server"))), []).append(r)
        trainers = {k[1]: rs[-1] for k, rs in series.items() if k[0] == "trainer"}
        # A server restarted under the engine appended to its file with counters from 0 again.
        servers = {k[1]: carry_series(rs)[-1] for k, rs in series.items() if k[0] == "server"}
        ended = time.time()
        write_json(self.run_dir / "summary.json", {
            "job_id": None, "started": self.started, "ended": ended, "duration_s": round(ended - self.started, 3),
            "exit_code": exit_code, "processes": [{"name": "server 0", "host": socket.gethostname(),
                                                   "exit_code": exit_code}],
            "totals": {"steps": {str(t): r.get("step", 0) for t, r in sorted(trainers.items())},
                       "samples": sum(r.get("samples", 0) for r in trainers.values()),
                       "sparse_rows": sum(r.get("rows", 0) for r in servers.values()),
                       "dense_elements": sum(r.get("elements", 0) for r in servers.values()),
                       **{k: sum(r.get(k, 0) for r in servers.values()) for k in ("requests", "bytes_in", "bytes_out")}},
            "staleness": None, "written_by": "server 0 (paramshard run: no launcher sees every process)"})
