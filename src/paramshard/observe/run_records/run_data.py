"""Reading a run directory (layout: paramshard.observe.run_records.records) into one object for
`paramshard report`: records split by kind, the JSON files, the list of logs."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from paramshard.errors import ConfigError
from paramshard.observe.run_records.counter_carry import carry_series
from paramshard.observe.run_records.records import read_records


@dataclass
class RunData:
    run_dir: Path
    trainers: dict[int, list[dict]] = field(default_factory=dict)   # trainer id -> its records, in time order
    servers: dict[int, list[dict]] = field(default_factory=dict)    # server id -> its records, in time order
    events: list[dict] = field(default_factory=list)
    geo_rounds: dict[int, list[dict]] = field(default_factory=dict)   # trainer id -> its GEO rounds (geo/records.py)
    t0: float | None = None          # time of the first record: plots' time axes start here
    summary: dict | None = None      # None: the run is still going, or its launcher was killed
    plan: dict | None = None
    config: dict | None = None
    logs: list[Path] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)   # unreadable files, shown on the page

    @property
    def job_id(self) -> str | None:
        for source in (self.summary, self.config):
            if isinstance(source, dict) and source.get("job_id"):
                return str(source["job_id"])
        return None


def logged_series(records: list[dict]) -> dict[str, list[tuple[float, object, float]]]:
    """Every value one trainer logged, by name: [(step, epoch, value)] in the order logged (a step
    as the record wrote it: an int, or a float in a record written by hand).

    From each record's ``logged`` calls; a record from before they were kept (no ``logged``)
    gives its latest ``metrics`` at its own step, which is all it has."""
    out: dict[str, list[tuple[float, object, float]]] = {}
    for r in records:
        calls = r.get("logged")
        if not isinstance(calls, list):
            metrics = r.get("metrics")
            calls = [{"step": r.get("step"), "epoch": r.get("epoch"), "values": metrics}] \
                if isinstance(metrics, dict) else []
        for call in calls:
            values = call.get("values") if isinstance(call, dict) else None
            step = call.get("step") if isinstance(call, dict) else None
            if not isinstance(values, dict) or isinstance(step, bool) or not isinstance(step, (int, float)):
                continue
            for name, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    out.setdefault(str(name), []).append((step, call.get("epoch"), float(value)))
    return out


def _id(record: dict, key: str) -> int | None:
    value = record.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _read_json(path: Path, problems: list[str]) -> dict | None:
    """A missing file is normal (a run in progress has no summary.json yet); an unreadable
    one is reported on the page rather than failing the whole report."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        problems.append(f"{path.name} could not be read ({exc}); its section is left out")
        return None
    if not isinstance(data, dict):
        problems.append(f"{path.name} is not a JSON object; its section is left out")
        return None
    return data


def load_run(run_dir: str | Path) -> RunData:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir}: no such directory; pass a run directory "
                          "(the --run-dir of `paramshard launch`, by default runs/YYYYmmdd-HHMMSS-JOBID)")
    # `paramshard launch` writes one metrics.jsonl; `paramshard run --run-dir` one file a rank
    # under metrics/ (observe/run_records/rank_records.py).
    files = [run_dir / "metrics.jsonl"] if (run_dir / "metrics.jsonl").is_file() else \
        sorted((run_dir / "metrics").glob("*.jsonl")) if (run_dir / "metrics").is_dir() else []
    if not files:
        raise ConfigError(f"{run_dir} is not a run directory: it has no metrics.jsonl "
                          "(written by `paramshard launch` as the job runs) nor metrics/*.jsonl (`paramshard "
                          "run --run-dir`); pass the directory the launcher printed")
    run = RunData(run_dir)
    records = []
    for metrics in files:
        try:
            records += list(read_records(metrics))
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{metrics}: cannot read it ({exc})") from exc
    for record in records:
        # Anything not shaped like a record (a stray value, a record from a newer version
        # with another kind) is left out rather than failing the report.
        if not isinstance(record, dict) or not isinstance(record.get("t"), (int, float)):
            continue
        if run.t0 is None or record["t"] < run.t0:
            run.t0 = float(record["t"])
        kind = record.get("kind")
        if kind == "trainer" and _id(record, "trainer") is not None:
            run.trainers.setdefault(record["trainer"], []).append(record)
        elif kind == "server" and _id(record, "server") is not None:
            run.servers.setdefault(record["server"], []).append(record)
        elif kind == "event":
            run.events.append(record)
        elif kind == "geo_round" and _id(record, "trainer") is not None:
            run.geo_rounds.setdefault(record["trainer"], []).append(record)
    for group in (*run.trainers.values(), *run.servers.values(), *run.geo_rounds.values()):
        group.sort(key=lambda r: r["t"])   # the file is in time order; a stable sort keeps it so if not
    run.trainers = dict(sorted(run.trainers.items()))
    run.geo_rounds = dict(sorted(run.geo_rounds.items()))
    # Counters of a server restarted under `paramshard run` start again from 0 in its file
    # (the launcher's records are carried already: a second pass changes nothing).
    run.servers = {s: carry_series(records) for s, records in sorted(run.servers.items())}
    run.summary = _read_json(run_dir / "summary.json", run.problems)
    run.plan = _read_json(run_dir / "plan.json", run.problems)
    run.config = _read_json(run_dir / "config.json", run.problems)
    logs = run_dir / "logs"
    if logs.is_dir():
        # trainer-2.log before trainer-10.log
        run.logs = sorted((p for p in logs.rglob("*") if p.is_file()),
                          key=lambda p: [int(part) if part.isdigit() else part
                                         for part in re.split(r"(\d+)", str(p.relative_to(logs)))])
    return run
