"""A directory of deltas and snapshots: where servers publish and serving replicas follow.

Layout (``DELTA_DIR`` is what ``--deltas`` / PARAMSHARD_DELTA_DIR names)::

    DELTA_DIR/model.pt                       the model file (spec, table settings, dense values)
                                             the trainer chief wrote when publishing began
    DELTA_DIR/blocks.json                    dense block name -> [parameter, offset, elements]
    DELTA_DIR/server-0/snapshot-0000000000.psd   all server 0 held when it began publishing
    DELTA_DIR/server-0/delta-0000000001.psd      what it changed next, ...
    DELTA_DIR/server-0/snapshot-0000000040.psd   every K deltas: all it holds (= snapshot 0 + deltas 1..40)
    DELTA_DIR/replicas/HOST-PORT.json         each running `paramshard serve`'s status (online/replica_status.py)

Each file appears whole or not at all: written under a dot-name in the same directory, flushed,
then renamed (a follower never lists a dot-name). Sequence numbers are per server and have no gaps;
a follower applies each server's files in seq order and, across servers, in order of ``created``
(the writing server's clock, never decreasing per server). Only rows and blocks that moved between
servers are in two servers' files, and their old owner published them last before the move began,
their new owner first once the hand-off made them its own: in order of time, the newer value comes
last. (Not ``step``: in async mode each server counts its own pushes, so the steps of two servers
do not compare; across hosts, this order relies on their clocks agreeing to well under a move's
duration, which NTP gives.)
"""
from __future__ import annotations

import dataclasses
import os
import re
import uuid
from pathlib import Path

from paramshard.online.delta_format import Delta, encode

FILE = re.compile(r"^(delta|snapshot)-(\d{10})\.psd$")
SERVER_DIR = re.compile(r"^server-(\d+)$")


@dataclasses.dataclass(frozen=True, order=True)
class Entry:
    seq: int
    kind: str             # "delta" or "snapshot"
    path: Path


def file_name(kind: str, seq: int) -> str:
    return f"{kind}-{seq:010d}.psd"


class DeltaLog:
    def __init__(self, root):
        self.root = Path(root)

    def server_dir(self, server: int) -> Path:
        return self.root / f"server-{server}"

    def servers(self) -> list[int]:
        """Servers that published anything, ascending."""
        if not self.root.is_dir():
            return []
        found = (SERVER_DIR.match(p.name) for p in self.root.iterdir() if p.is_dir())
        return sorted(int(m.group(1)) for m in found if m)

    def publish(self, delta: Delta) -> Path:
        """Write ``delta`` atomically; returns its path. Durable once this returns (file and
        directory flushed), so a server killed right after has published it."""
        directory = self.server_dir(delta.server)
        directory.mkdir(parents=True, exist_ok=True)
        final = directory / file_name(delta.kind, delta.seq)
        temporary = directory / f".{final.name}.{uuid.uuid4().hex[:8]}.tmp"
        data = encode(delta)
        with open(temporary, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, final)
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return final

    def entries(self, server: int) -> list[Entry]:
        """Server ``server``'s published files, by seq (a snapshot after the delta of its seq)."""
        directory = self.server_dir(server)
        if not directory.is_dir():
            return []
        found = []
        for path in directory.iterdir():
            m = FILE.match(path.name)
            if m:
                found.append(Entry(int(m.group(2)), m.group(1), path))
        return sorted(found, key=lambda e: (e.seq, e.kind == "snapshot"))

    def latest_snapshot(self, server: int) -> Entry | None:
        snapshots = [e for e in self.entries(server) if e.kind == "snapshot"]
        return snapshots[-1] if snapshots else None

    def deltas_after(self, server: int, seq: int) -> list[Entry]:
        """Server ``server``'s deltas with a seq above ``seq``, in order."""
        return [e for e in self.entries(server) if e.kind == "delta" and e.seq > seq]

    def prune(self, server: int, keep_snapshots: int = 2) -> int:
        """Remove files no replica needs: everything before the ``keep_snapshots``-th newest
        snapshot (a replica that started from it still finds every delta after it). Returns how
        many files were removed."""
        entries = self.entries(server)
        snapshots = [e for e in entries if e.kind == "snapshot"]
        if len(snapshots) < keep_snapshots:
            return 0
        oldest_kept = snapshots[-keep_snapshots]
        doomed = [e for e in entries if e.seq < oldest_kept.seq or (e.seq == oldest_kept.seq and e.kind == "delta")]
        for entry in doomed:
            entry.path.unlink(missing_ok=True)
        return len(doomed)
