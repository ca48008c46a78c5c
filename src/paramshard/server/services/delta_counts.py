"""What a server's delta publisher wrote, counted for its ``stats`` reply (messages/server_stats.py
DeltaStats) and from there the run directory's records and `paramshard report`.

Counted as each file becomes durable (DeltaLog.publish returned): a delta on the loop's thread, a
snapshot on its writer thread, so the counters are kept under a lock and read whole.
"""
from __future__ import annotations

import threading

from paramshard.messages.server_stats import DeltaStats
from paramshard.online.delta_format import Delta


class PublishedCounts:
    def __init__(self):
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(DeltaStats.COUNTS, 0)
        self._last_seq: int | None = None
        self._last_at: float | None = None         # the publisher's clock when the last file was durable
        self._last_publish_s: float | None = None

    def note(self, delta: Delta, size: int, seconds: float, at: float) -> None:
        """``delta`` was published: ``size`` bytes on disk, ``seconds`` from taking it to durable."""
        rows = sum(len(t.ids) for t in delta.tables.values())
        with self._lock:
            c = self._counts
            c["bytes"] += size
            if delta.kind == "snapshot":
                c["snapshots"] += 1
                c["snapshot_bytes"] += size
                c["last_snapshot_bytes"], c["last_snapshot_rows"] = size, rows
            else:
                c["deltas"] += 1
                c["delta_bytes"] += size
                c["rows"] += rows
                c["tombstones"] += sum(len(t.tombstones) for t in delta.tables.values())
                c["max_delta_bytes"] = max(c["max_delta_bytes"], size)
                c["max_delta_rows"] = max(c["max_delta_rows"], rows)
            # A snapshot written late by its thread carries the seq of a delta already counted.
            self._last_seq = delta.seq if self._last_seq is None else max(self._last_seq, delta.seq)
            self._last_at, self._last_publish_s = at, seconds

    def part(self, now: float) -> DeltaStats:
        """The stats part at ``now`` (the publisher's clock)."""
        with self._lock:
            since = None if self._last_at is None else round(max(0.0, now - self._last_at), 6)
            return DeltaStats(**self._counts, last_seq=self._last_seq, since_last_s=since,
                              last_publish_s=None if self._last_publish_s is None else round(self._last_publish_s, 6))

    def published(self) -> dict:
        """{"deltas", "snapshots", "bytes"}: files and bytes published so far."""
        with self._lock:
            return {k: self._counts[k] for k in ("deltas", "snapshots", "bytes")}
