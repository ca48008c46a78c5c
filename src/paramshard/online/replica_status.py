"""The status files serving replicas leave in a delta directory, so whoever reads the directory (
`paramshard report`) sees who follows it, what they applied and how fresh it is.

Layout: ``DELTA_DIR/replicas/<host>-<port>.json``, one per running `paramshard serve`, written whole
(a dot-name in the same directory, then renamed) every ``interval_s`` seconds while it runs and
removed when it stops cleanly::

    {"format": "paramshard-replica-status", "version": 1,
     "replica": "host-8500", "host": "host", "port": 8500, "pid": 1234, "url": "http://127.0.0.1:8500",
     "interval_s": 5.0,                       # how often it is rewritten
     "started": 1764412300.1, "updated": 1764412345.2,     # unix seconds
     "version": {"servers": {"0": 12, "1": 11}, "step": 340, "number": 25},   # what it serves
     "step": 340,
     "newest_created": 1764412344.0,          # `created` of the newest file applied (None: none yet)
     "freshness_s": 1.2,                      # updated - newest_created (None: none applied)
     "files_applied": 25, "rows_applied": 81234, "ok": true,
     "errors": {"server 1": "..."}, "last_error": "..." | None}

A replica killed (kill -9, a lost host) leaves its file behind: a file not rewritten for more than
STALE_AFTER x its interval is *stale* (the replica is gone or hung) and is reported so, never as
fresh. Replicas' clocks and the reader's are assumed to agree (one machine, or NTP).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import uuid
from pathlib import Path

FORMAT = "paramshard-replica-status"
VERSION = 1
FOLDER = "replicas"
STALE_AFTER = 3.0            # intervals without a rewrite before a status is stale
MAX_BYTES = 1 << 20          # a status file is a few hundred bytes: anything larger is not one
_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


def status_path(root, host: str, port: int) -> Path:
    return Path(root) / FOLDER / f"{_NAME.sub('_', host)}-{int(port)}.json"


def write_status(path: Path, status: dict) -> None:
    """``status`` into ``path`` whole: a reader sees the previous file or this one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        temporary.write_text(json.dumps({"format": FORMAT, "version": VERSION, **status}, default=float))
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


@dataclasses.dataclass(frozen=True)
class ReplicaStatus:
    path: Path
    data: dict              # the file's fields (module doc)
    age_s: float            # seconds since it was last rewritten, at the reader's ``now``
    stale: bool             # not rewritten for more than STALE_AFTER x its interval

    @property
    def name(self) -> str:
        return str(self.data.get("replica") or self.path.stem)

    @property
    def applied(self) -> dict[int, int]:
        """server -> the seq of its last file the replica serves."""
        servers = (self.data.get("version") or {}).get("servers") if isinstance(self.data.get("version"), dict) \
            else None
        out = {}
        for server, seq in (servers.items() if isinstance(servers, dict) else ()):
            if str(server).isdigit() and _is_int(seq):
                out[int(server)] = seq
        return out


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def read_statuses(root, now: float) -> tuple[list[ReplicaStatus], list[str]]:
    """The replicas' status files of delta directory ``root`` at ``now`` (unix s), by name, and the
    problems with files that could not be read (named, so the reader can remove them)."""
    folder = Path(root) / FOLDER
    if not folder.is_dir():
        return [], []
    found, problems = [], []
    for path in sorted(folder.glob("*.json")):
        if path.name.startswith("."):
            continue
        try:
            if path.stat().st_size > MAX_BYTES:
                raise ValueError(f"{path.stat().st_size} bytes, more than a status file has")
            data = json.loads(path.read_text())
        except FileNotFoundError:
            continue                       # removed by its replica as it stopped
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            problems.append(f"{path}: not a replica status ({exc})")
            continue
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            problems.append(f"{path}: not a replica status (no {FORMAT!r} format)")
            continue
        updated, interval = _number(data.get("updated")), _number(data.get("interval_s"))
        if updated is None or interval is None or interval <= 0:
            problems.append(f"{path}: a replica status without 'updated' or 'interval_s'")
            continue
        age = max(0.0, now - updated)
        found.append(ReplicaStatus(path, data, age, age > STALE_AFTER * interval))
    return found, problems
