"""A delta directory's model, rebuilt the plain way: the reference a follower must equal.

``rebuild(root)`` reads, for each server, its latest snapshot and the deltas after it, and applies
them to one model: each server's files in seq order, the servers' files merged in order of
``created`` (ties: the lower server first), as online/delta_log.py says a follower does. A snapshot
or delta sets rows and dense blocks; a tombstone removes its id. Dicts and arrays, not fast: for
tests and for checking a serving replica, not for serving.
"""
from __future__ import annotations

import dataclasses
import heapq

import numpy as np

from paramshard.online.delta_format import Delta, DeltaError, read_delta
from paramshard.online.delta_log import DeltaLog


@dataclasses.dataclass
class Rebuilt:
    tables: dict[str, dict[int, np.ndarray]]     # table -> id -> row (the dtype published)
    dense: dict[str, np.ndarray]                 # block -> float32 values
    steps: dict[int, int]                        # server -> step of the last file applied
    seqs: dict[int, int]                         # server -> seq of the last file applied

    def table(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(ids ascending as uint64, their rows) of one table."""
        rows = self.tables.get(name, {})
        ids = np.array(sorted(rows), np.uint64)
        if not len(ids):
            return ids, np.zeros((0, 0), np.float32)
        return ids, np.stack([rows[int(i)] for i in ids])


def server_files(log: DeltaLog, server: int) -> list[Delta]:
    """Server ``server``'s latest snapshot and the deltas after it, in seq order, checked."""
    snapshot = log.latest_snapshot(server)
    if snapshot is None:
        raise DeltaError(f"{log.server_dir(server)}: no snapshot yet: server {server} has not begun publishing")
    files = [read_delta(snapshot.path)] + [read_delta(e.path) for e in log.deltas_after(server, snapshot.seq)]
    for before, after in zip(files, files[1:]):
        if after.seq != before.seq + 1:
            raise DeltaError(f"{log.server_dir(server)}: seq {before.seq + 1} is missing (next: {after.seq})")
    return files


def apply(model: Rebuilt, delta: Delta) -> None:
    for name, change in delta.tables.items():
        rows = model.tables.setdefault(name, {})
        for i, row in zip(change.ids.tolist(), change.values):
            rows[i] = row.copy()
        for i in change.tombstones.tolist():
            rows.pop(i, None)
    for name, values in delta.dense.items():
        model.dense[name] = values.copy()
    model.steps[delta.server], model.seqs[delta.server] = delta.step, delta.seq


def rebuild(root) -> Rebuilt:
    log = DeltaLog(root)
    queues = {s: server_files(log, s) for s in log.servers()}
    model = Rebuilt({}, {}, {}, {})
    heads = [(files[0].created, s, 0) for s, files in queues.items() if files]
    heapq.heapify(heads)
    while heads:        # per server in seq order; across servers the earliest written next
        _, server, i = heapq.heappop(heads)
        files = queues[server]
        apply(model, files[i])
        if i + 1 < len(files):
            heapq.heappush(heads, (files[i + 1].created, server, i + 1))
    return model
