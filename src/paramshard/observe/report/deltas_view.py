"""`paramshard report`'s "Deltas and serving replicas": how often and how much the servers published
(server/services/delta_service.py) and how fresh each serving replica is (online/replica_status.py).

Two sources, one view:
- a run directory: each server's records carry its publisher's counters (``deltas`` in a server
  record, observe/run_records/records.py); the delta directory is the job's ``launch --deltas``
  (config.json), where the replicas' status files are;
- a delta directory given directly: the figures from the files alone (each file's header: its
  rows and ``created``; its size on disk). Pruned files are gone, so they cover what is still there.

A delta's size: from records, each record interval's mean (bytes and rows published over deltas
published since the previous record: one delta an interval at the default 2 s of both), whose
median is shown, and the largest delta the server counted; from files, each file's.
A replica's lag: the seq each server last published minus the seq the replica serves of it.
"""
from __future__ import annotations

import dataclasses
import json
import math
import statistics
import struct
import time
from pathlib import Path

from paramshard.online.delta_format import MAGIC, MAX_HEADER
from paramshard.online.delta_log import DeltaLog
from paramshard.online.replica_status import STALE_AFTER, ReplicaStatus, read_statuses
from paramshard.settings.table import by_field

_LENGTH = struct.Struct("<I")


@dataclasses.dataclass(frozen=True)
class Publishing:
    """One server's publishing, from its records or its files."""
    server: int
    deltas: int
    per_minute: float | None           # None: too few records or files to say
    median_bytes: float | None
    max_bytes: int | None
    median_rows: float | None
    max_rows: int | None
    snapshots: int
    snapshot_bytes: int | None         # the last snapshot's
    snapshot_rows: int | None
    last_seq: int | None
    since_last_s: float | None         # seconds from the last file to the record (or to now, from files)


def _n(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _i(v) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0


# -- from a run directory's records ----------------------------------------------------------------
def from_records(server: int, records: list[dict]) -> Publishing | None:
    """A server's publishing from its records (time order); None when none has ``deltas``."""
    rows = [(r["t"], r["deltas"]) for r in records if isinstance(r.get("deltas"), dict) and _n(r.get("t")) is not None]
    if not rows:
        return None
    totals = {"deltas": 0, "snapshots": 0}
    sizes: list[tuple[float, float]] = []       # (mean bytes, mean rows) of the deltas of each interval
    timed = 0                                   # deltas published between the first record and the last
    before: dict | None = None
    for _, d in rows:
        now = {k: _i(d.get(k)) for k in ("deltas", "snapshots", "delta_bytes", "rows")}
        # A counter that went down: a new process (restarted in place) counting from 0 again.
        old = before
        inc = now if old is None or any(now[k] < old[k] for k in now) else {k: now[k] - old[k] for k in now}
        for k in totals:
            totals[k] += inc[k]
        if before is not None:
            timed += inc["deltas"]
        if inc["deltas"]:
            sizes.append((inc["delta_bytes"] / inc["deltas"], inc["rows"] / inc["deltas"]))
        before = now
    span = rows[-1][0] - rows[0][0]
    last = rows[-1][1]
    snapshot = next((d for _, d in reversed(rows) if _i(d.get("snapshots"))), None)
    maxima = [(_i(d.get("max_delta_bytes")), _i(d.get("max_delta_rows"))) for _, d in rows]
    return Publishing(
        server, totals["deltas"], timed / span * 60 if span > 0 and len(rows) > 1 else None,
        statistics.median(b for b, _ in sizes) if sizes else None,
        max(b for b, _ in maxima) if totals["deltas"] else None,
        statistics.median(r for _, r in sizes) if sizes else None,
        max(r for _, r in maxima) if totals["deltas"] else None,
        totals["snapshots"], _i(snapshot.get("last_snapshot_bytes")) if snapshot else None,
        _i(snapshot.get("last_snapshot_rows")) if snapshot else None,
        last.get("last_seq") if isinstance(last.get("last_seq"), int) else None, _n(last.get("since_last_s")))


# -- from a delta directory's files ----------------------------------------------------------------
def read_header(path: Path) -> dict:
    """A delta file's header (online/delta_format.py), without reading its payload: the report
    reads every file's rows and time, and a snapshot may be gigabytes. ValueError if it is none."""
    with open(path, "rb") as f:
        head = f.read(len(MAGIC) + _LENGTH.size)
        if len(head) < len(MAGIC) + _LENGTH.size or head[:len(MAGIC)] != MAGIC:
            raise ValueError("not a paramshard delta of this version")
        (length,) = _LENGTH.unpack_from(head, len(MAGIC))
        if length > MAX_HEADER:
            raise ValueError(f"a header of {length} bytes")
        header = json.loads(f.read(length).decode())
    if not isinstance(header, dict) or not isinstance(header.get("tables"), dict):
        raise ValueError("its header is no object with tables")
    return header


def _rows(header: dict) -> int:
    return sum(_i(t.get("rows")) for t in header["tables"].values() if isinstance(t, dict))


def from_files(root, server: int, now: float, problems: list[str]) -> Publishing | None:
    """A server's publishing from the files of it still in the delta directory."""
    deltas: list[tuple[int, int, int, float | None]] = []          # (seq, bytes, rows, created)
    snapshots: list[tuple[int, int, int, float | None]] = []
    for entry in DeltaLog(root).entries(server):
        try:
            size = entry.path.stat().st_size
            header = read_header(entry.path)
        except FileNotFoundError:
            continue                        # pruned while listed
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            problems.append(f"{entry.path}: unreadable ({exc})")
            continue
        (snapshots if entry.kind == "snapshot" else deltas).append(
            (entry.seq, size, _rows(header), _n(header.get("created"))))
    if not deltas and not snapshots:
        return None
    times = sorted(c for *_, c in deltas if c is not None)
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    newest = max((c for *_, c in deltas + snapshots if c is not None), default=None)
    last_snapshot = max(snapshots) if snapshots else None
    return Publishing(
        server, len(deltas), (len(times) - 1) / span * 60 if span > 0 else None,
        statistics.median(b for _, b, _, _ in deltas) if deltas else None,
        max(b for _, b, _, _ in deltas) if deltas else None,
        statistics.median(r for _, _, r, _ in deltas) if deltas else None,
        max(r for _, _, r, _ in deltas) if deltas else None,
        len(snapshots), last_snapshot[1] if last_snapshot else None, last_snapshot[2] if last_snapshot else None,
        max(e[0] for e in deltas + snapshots), None if newest is None else max(0.0, now - newest))


def published_seqs(root) -> dict[int, int]:
    """Each server's last published seq in the delta directory."""
    log = DeltaLog(root)
    out = {}
    for server in log.servers():
        entries = log.entries(server)
        if entries:
            out[server] = entries[-1].seq
    return out


def lag(status: ReplicaStatus, published: dict[int, int]) -> dict[int, int | None]:
    """server -> seqs the replica is behind it (None: a server it does not serve yet)."""
    applied = status.applied
    return {s: (seq - applied[s] if s in applied else None) for s, seq in sorted(published.items())}


# -- the delta directory of a run --------------------------------------------------------------------
def delta_dir_of(run) -> Path | None:
    """The job's delta directory (config.json: ``launch --deltas``, else a rank's PARAMSHARD_DELTA_DIR):
    as recorded if it exists, else relative to the run directory's parent (a relative path recorded by
    an older launcher, read from elsewhere)."""
    config = run.config if isinstance(run.config, dict) else {}
    launch, ranks = config.get("launch"), config.get("ranks")
    found = launch.get("delta_dir") if isinstance(launch, dict) else None
    for contract in ranks.values() if isinstance(ranks, dict) else ():
        environ = contract.get("environ") if isinstance(contract, dict) else None
        if not found and isinstance(environ, dict):
            found = by_field("delta_dir").read(environ)
    if not isinstance(found, str) or not found:
        return None
    path = Path(found)
    if not path.is_absolute() and not path.is_dir() and (run.run_dir.parent / path).is_dir():
        return run.run_dir.parent / path
    return path


# -- text -------------------------------------------------------------------------------------------
def _size(n) -> str:
    if n is None:
        return "—"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"


def _count(n) -> str:
    return "—" if n is None else f"{n:,.0f}"


def publishing_line(p: Publishing, source: str = "its last record") -> str:
    rate = "" if p.per_minute is None else f" ({p.per_minute:,.1f}/min)"
    line = f"server {p.server}: {p.deltas:,} deltas{rate}"
    if p.deltas:
        line += (f", size median {_size(p.median_bytes)} / {_count(p.median_rows)} rows, "
                 f"max {_size(p.max_bytes)} / {_count(p.max_rows)} rows")
    line += f"; {p.snapshots:,} snapshots"
    if p.snapshot_bytes is not None:
        line += f", the last {_size(p.snapshot_bytes)} / {_count(p.snapshot_rows)} rows"
    if p.last_seq is not None:
        line += f"; last seq {p.last_seq}"
        if p.since_last_s is not None:
            line += f", {p.since_last_s:,.1f} s before {source}"
    return line


def replica_line(status: ReplicaStatus, published: dict[int, int]) -> str:
    d = status.data
    where = f" ({d['url']})" if isinstance(d.get("url"), str) else ""
    behind = ", ".join(f"server {s} " + ("not served yet" if n is None else f"{n} behind")
                       for s, n in lag(status, published).items()) or "no server published"
    if status.stale:
        interval = _n(d.get("interval_s")) or 0.0
        return (f"replica {status.name}{where}: GONE or hung: its status was not rewritten for "
                f"{status.age_s:,.1f} s (more than {STALE_AFTER:g} x its {interval:g} s); when last seen it "
                f"served step {d.get('step')}, {behind}")
    fresh = _n(d.get("freshness_s"))
    state = "ok" if d.get("ok") else f"NOT ok ({d.get('last_error') or 'see its /health'})"
    return (f"replica {status.name}{where}: {state}; freshness "
            f"{'— (nothing applied yet)' if fresh is None else f'{fresh:,.1f} s'}, step {d.get('step')}, lag: "
            f"{behind}; {_count(_n(d.get('files_applied')))} files applied; status {status.age_s:,.1f} s old")


def replica_lines(root, now: float) -> list[str]:
    statuses, problems = read_statuses(root, now)
    published = published_seqs(root)
    if not statuses:
        lines = [f"serving replicas: none running (no status file in {Path(root) / 'replicas'})"]
    else:
        lines = [f"serving replicas ({len(statuses)}):"] + [f"  {replica_line(s, published)}" for s in statuses]
    return lines + [f"  warning: {p}" for p in problems]


def run_lines(run, now: float | None = None) -> list[str]:
    """The section for a run directory: nothing for a job that published no deltas."""
    now = time.time() if now is None else now
    figures = [p for p in (from_records(s, rs) for s, rs in run.servers.items()) if p is not None]
    root = delta_dir_of(run)
    if not figures and root is None:
        return []
    lines = ["deltas" + (f" ({root})" if root is not None else "") + ":"]
    lines += [f"  {publishing_line(p)}" for p in figures]
    if root is not None and root.is_dir():
        if not figures:
            lines += [f"  {line}" for line in dir_publishing_lines(root, now)]
        lines += [f"  {line}" for line in replica_lines(root, now)]
    elif root is not None:
        lines.append(f"  the delta directory {root} is not there (moved, or on another host): no replicas shown")
    return lines


def dir_publishing_lines(root, now: float) -> list[str]:
    problems: list[str] = []
    figures = [p for p in (from_files(root, s, now, problems) for s in DeltaLog(root).servers()) if p is not None]
    lines = [publishing_line(p, "now") + " (files still there)" for p in figures] or ["no server published yet"]
    return lines + [f"warning: {p}" for p in problems]


def is_delta_dir(path) -> bool:
    path = Path(path)
    return path.is_dir() and not (path / "metrics.jsonl").is_file() and not (path / "metrics").is_dir() and (
        (path / "model.pt").is_file() or bool(DeltaLog(path).servers()))


def delta_dir_lines(root, now: float | None = None) -> list[str]:
    """`paramshard report DELTA_DIR`: the figures from the files alone, then the replicas."""
    now = time.time() if now is None else now
    return [f"delta directory {root}:"] + [f"  {line}" for line in dir_publishing_lines(root, now)] + \
        replica_lines(root, now)


# -- the page ---------------------------------------------------------------------------------------
def html_section(run, table, escape, now: float | None = None) -> str:
    """The page's section (``table(header, rows, numeric)`` and ``escape`` are html.py's)."""
    now = time.time() if now is None else now
    figures = [p for p in (from_records(s, rs) for s, rs in run.servers.items()) if p is not None]
    root = delta_dir_of(run)
    if not figures and root is None:
        return ""
    out = "<h2>Deltas and serving replicas</h2>\n"
    if root is not None:
        out += f"<p>delta directory: {escape(root)}</p>\n"
    if figures:
        out += table(["server", "deltas", "per minute", "median bytes", "max bytes", "median rows", "max rows",
                      "snapshots", "last snapshot bytes", "last snapshot rows", "last seq"],
                     [[p.server, p.deltas, "—" if p.per_minute is None else f"{p.per_minute:,.1f}",
                       _size(p.median_bytes), _size(p.max_bytes), _count(p.median_rows), _count(p.max_rows),
                       p.snapshots, _size(p.snapshot_bytes), _count(p.snapshot_rows), _count(p.last_seq)]
                      for p in figures], numeric=set(range(11)))
    if root is None or not root.is_dir():
        return out
    statuses, problems = read_statuses(root, now)
    published = published_seqs(root)
    if not statuses:
        out += '<p class="skipped">No serving replica running (no status file in its replicas/).</p>\n'
    else:
        out += table(["replica", "state", "freshness (s)", "step", "lag (seqs behind, by server)", "files applied",
                      "status age (s)", "last error"],
                     [[s.name, "gone or hung (stale)" if s.stale else ("ok" if s.data.get("ok") else "not ok"),
                       _count(None) if _n(s.data.get("freshness_s")) is None else f"{s.data['freshness_s']:,.1f}",
                       s.data.get("step", "—"),
                       ", ".join(f"{k}: {'—' if n is None else n}" for k, n in lag(s, published).items()) or "—",
                       _count(_n(s.data.get("files_applied"))), f"{s.age_s:,.1f}", s.data.get("last_error") or "—"]
                      for s in statuses], numeric={2, 3, 5, 6})
    out += "".join(f'<p class="warn">{escape(p)}</p>\n' for p in problems)
    return out
