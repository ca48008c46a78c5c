"""The launcher's side of a run directory: every process's log, the configuration,
the records the trainers print and the servers answer, and the summary at the end.

Trainers print their records on stdout behind a marker (``records.MARK``); the
launcher reads every child's output anyway (launch/engines/processes.py), so the
records travel the same way over SSH as locally, and nothing needs a shared
file system. The tap takes them out of the output and writes every other line
to the process's own log file.

The run directory must be the user's own, writable by nobody else (safe_files.py: checked
before anything is written), and every file in it is opened without following links.
"""
from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path
from typing import Callable

from paramshard.safe_files import check_private_dir, make_private_dir, open_append, write_whole
from paramshard.observe.run_records.counter_carry import CounterCarry
from paramshard.observe.run_records.records import CONTROL, ENDED, MARK, RecordWriter, write_json
from paramshard.observe.live.tensorboard_writer import TENSORBOARD_DIR, TensorBoardWriter

REDACTED = "<redacted>"
SECRET_FILE = "secret"      # the generated secret of a `paramshard launch` job (0600)


def write_private(path: Path, text: str) -> None:
    """``text`` into ``path``, mode 0600 from the start (no moment when others may read it), through
    a new file (never an existing one or a link planted in its place)."""
    write_whole(path, text, mode=0o600)


def read_secret(run_dir) -> str | None:
    """The secret `paramshard launch` made for the job of ``run_dir``, if it made one."""
    try:
        return (Path(run_dir) / SECRET_FILE).read_text().strip() or None
    except FileNotFoundError:
        return None


class RunDir:
    def __init__(self, path, job_id: str):
        self.path = Path(path)
        self.job_id = job_id
        # Before anything is written: a directory others can write would let them steer the job.
        make_private_dir(self.path)
        if not (self.path / "logs").exists():
            (self.path / "logs").mkdir(mode=0o755)
        check_private_dir(self.path / "logs", "log folder")
        # A summary says the job is over (`paramshard scale`, `paramshard report` read it so): one
        # left by an earlier job launched into this directory is not this job's.
        (self.path / "summary.json").unlink(missing_ok=True)
        (self.path / CONTROL / ENDED).unlink(missing_ok=True)      # nor its launcher's "no more requests"
        self.records = RecordWriter(self.path / "metrics.jsonl")
        self.tensorboard = TensorBoardWriter(self.path / TENSORBOARD_DIR)    # the same records, for TensorBoard
        self._carries: dict[int, CounterCarry] = {}     # server -> its counters across restarts
        self.started = time.time()
        self.trainers: dict[int, dict] = {}     # latest record of each trainer
        self.servers: dict[int, dict] = {}      # latest record of each server
        self._lock = threading.Lock()
        self._logs: list = []

    # -- what the processes print ----------------------------------------------
    def tap_for(self, rank) -> Callable[[str], bool]:
        """A Child tap for ``rank``: its lines into logs/<name>.log, its records into metrics.jsonl."""
        log = open_append(self.path / "logs" / f"{rank.name.replace(' ', '-')}.log")   # never through a link
        self._logs.append(log)

        def tap(line: str) -> bool:
            if line.startswith(MARK):
                self.take_record(line[len(MARK):])
                return True
            try:
                log.write(line if line.endswith("\n") else line + "\n")
            except ValueError:          # closed at the end while the pump drains the last lines
                pass
            return False
        return tap

    def take_record(self, text: str) -> None:
        try:
            record = json.loads(text)
        except json.JSONDecodeError:
            return                      # a torn line (the process died mid-print): nothing to keep
        if not isinstance(record, dict) or record.get("kind") not in ("trainer", "server", "geo_round"):
            return
        if record["kind"] == "geo_round":      # a GEO trainer's round (geo/records.py): kept as it is
            self.records.write(record)
            return
        if record["kind"] == "server":      # a server's final counters, printed as it stops
            with self._lock:
                before = self.servers.get(record["server"], {}) if isinstance(record.get("server"), int) else {}
            for rate in ("requests_per_s", "update_s"):     # it has no earlier counters of its own
                if record.get(rate) is None:
                    record[rate] = before.get(rate)
            self.server_record(record)
            return
        with self._lock:
            self.trainers[int(record.get("trainer", -1))] = record
        self.records.write(record)
        self.tensorboard.write(record)

    def server_record(self, record: dict) -> None:
        """A server's record, its counters made job totals: a server restarted in place counts
        from 0 again, and what its earlier process counted is added (observe/run_records/counter_carry.py)."""
        with self._lock:
            record, _ = self._carries.setdefault(record["server"], CounterCarry()).carry(record)
            self.servers[record["server"]] = record
        self.records.write(record)
        self.tensorboard.write(record)

    def event(self, event: str, text: str = "", **fields) -> None:
        self.records.write({"kind": "event", "event": event, "text": text, **fields})

    def latest(self) -> tuple[dict, dict]:
        with self._lock:
            return dict(self.trainers), dict(self.servers)

    # -- files -------------------------------------------------------------------
    def write_config(self, config, ranks) -> None:
        """The launch configuration and every rank's contract, the secret redacted."""
        fields = {k: v for k, v in dataclasses.asdict(config).items()}
        if fields.get("secret"):
            fields["secret"] = REDACTED
        contracts = {}
        for rank in ranks:
            environ = dict(rank.environ())
            for key in environ:
                if "SECRET" in key:
                    environ[key] = REDACTED
            contracts[rank.name] = {"host": rank.host, "argv": list(rank.argv), "environ": environ}
        write_json(self.path / "config.json", {"job_id": self.job_id, "launch": fields, "ranks": contracts})

    def write_secret(self, secret: str) -> None:
        """The job's generated secret in ``secret``, readable by this user only (0600), so that
        `paramshard stats RUN_DIR` can reach the servers; config.json never holds it. Written
        to a new file that replaces any old one, never through an existing file's mode."""
        write_private(self.path / SECRET_FILE, secret + "\n")

    def write_plan(self, stats: list) -> None:
        """plan.json from every server's ServerStats (messages/server_stats.py)."""
        servers = [{"server": s.server, "address": s.address, "dense_blocks": s.dense_blocks,
                    "dense_elements": s.dense_elements,
                    "tables": {n: {"rows": t.rows, "dim": t.dim} for n, t in s.tables.items()}}
                   for s in stats]
        loads = [s["dense_elements"] for s in servers]
        mean = sum(loads) / len(loads) if loads else 0
        write_json(self.path / "plan.json", {"servers": servers,
                                             "dense_load_max_over_mean": max(loads) / mean if mean else None})

    def write_summary(self, exit_code: int, processes) -> dict:
        trainers, servers = self.latest()
        histogram: dict[str, int] = {}
        for s in servers.values():
            for k, n in (s.get("staleness") or {}).items():
                histogram[k] = histogram.get(k, 0) + n
        ended = time.time()
        summary = {
            "job_id": self.job_id, "started": self.started, "ended": ended,
            "duration_s": round(ended - self.started, 3), "exit_code": exit_code,
            "processes": [{"name": getattr(p, "tag", "?"), "host": getattr(getattr(p, "host", None), "target", None),
                           "exit_code": p.poll()} for p in processes],
            "totals": {
                "steps": {str(t): r.get("step", 0) for t, r in sorted(trainers.items())},
                "samples": sum(r.get("samples", 0) for r in trainers.values()),
                "sparse_rows": sum(s.get("rows", 0) for s in servers.values()),
                "dense_elements": sum(s.get("elements", 0) for s in servers.values()),
                **{key: sum(s.get(key, 0) for s in servers.values()) for key in ("requests", "bytes_in", "bytes_out")},
            },
            "staleness": ({"max": max(int(k) for k in histogram), "histogram": histogram} if histogram else None),
        }
        write_json(self.path / "summary.json", summary)
        return summary

    def close(self) -> None:
        self.records.close()
        self.tensorboard.close()
        for log in self._logs:
            try:
                log.close()
            except ValueError:
                pass
