"""Publishing deltas while the job trains (issue 33): what this server changed, every N seconds or M pushes.

With PARAMSHARD_DELTA_DIR set (server/assembly.py adds this service), the server writes into
``DELTA_DIR/server-S/`` (layout: online/delta_log.py, file: online/delta_format.py):

- a snapshot (all rows it serves and all its dense blocks) when publishing begins: seq 0 for a
  new server; after the last published seq for a server restarted in place or rolled back (it
  read the directory / its state was reset), so a follower never keeps rows the server lost;
- a delta every PARAMSHARD_DELTA_SECONDS or PARAMSHARD_DELTA_UPDATES pushes, whichever comes
  first, when anything changed (seq 1, 2, ...): the current values of the rows changed since
  the last one (pushed, made by a pull, adopted in a move, imported, restored), tombstones for
  ids evicted (or dropped at a hand-off because their old owner had evicted them), and the dense
  blocks whose values moved more than PARAMSHARD_DELTA_DENSE_THRESHOLD (relative L2 change
  since they were last published; 0: any change);
- every PARAMSHARD_DELTA_SNAPSHOT_EVERY deltas a snapshot with the seq of the last delta, then
  the directory is pruned to the two newest snapshots and what follows them.

Everything is read from the tables on the server's own thread (a hook's ``tick`` or ``applied``,
between two requests), so each file is a consistent state at its ``step``. Rows travel by id
(the tables tell ``TableWatch`` which ids changed: SparseTable.watch). In an elastic job a row is
published only by the server that serves its partition and is not copying it out: an old owner
stops publishing a partition when its move begins, the new owner publishes all its rows once the
hand-off made them its own, so two servers never publish one id in the same period (a follower
applies servers' files in order of ``step``). Ids that moved away are never tombstoned.

What was published is counted in the server's ``stats`` reply (delta_counts.py: DeltaStats), so the
run directory's records and `paramshard report` show the delta rate and sizes.

A delta is encoded and written on the loop's thread (its size follows the rows touched); a
snapshot is copied there (ids, values, dense blocks: one gather) and encoded, checksummed and
written by a background thread, so the loop pauses only for the copy (docs/DESIGN.md "Deltas"
has the figures). The next delta waits for that write (at most PARAMSHARD_TIMEOUT; past it,
publishing pauses and the server says so) so files appear in seq order.
"""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from paramshard.env import ClusterEnv
from paramshard.log import get_logger
from paramshard.online.delta_format import Delta, TableChange
from paramshard.online.delta_log import DeltaLog
from paramshard.server.core.context import ServerContext
from paramshard.server.core.hooks import Incoming, Verdict
from paramshard.server.services.delta_counts import PublishedCounts
from paramshard.server.storage.dense_store import DenseStore

log = get_logger("server")

PUSH_OPS = ("push_dense", "push_sparse")
KEEP_SNAPSHOTS = 2
_EMPTY = np.zeros(0, np.uint64)


class TableWatch:
    """The ids of one table changed and evicted since they were last published (SparseTable.watch)."""

    def __init__(self):
        self._changed: list[np.ndarray] = []
        self._evicted: list[np.ndarray] = []

    def changed(self, ids: np.ndarray) -> None:
        if len(ids):
            self._changed.append(np.array(ids, np.uint64))

    def evicted(self, ids: np.ndarray) -> None:
        if len(ids):
            self._evicted.append(np.array(ids, np.uint64))

    @property
    def dirty(self) -> bool:
        return bool(self._changed or self._evicted)

    def take(self) -> tuple[np.ndarray, np.ndarray]:
        """(changed ids, evicted ids), each distinct, and start over."""
        changed = pd.unique(np.concatenate(self._changed)) if self._changed else _EMPTY
        evicted = pd.unique(np.concatenate(self._evicted)) if self._evicted else _EMPTY
        self._changed, self._evicted = [], []
        return np.asarray(changed, np.uint64), np.asarray(evicted, np.uint64)

    def keep(self, ids: np.ndarray) -> None:
        """Changed ids not publishable yet (partitions on their way here, or being copied out)."""
        self.changed(ids)


class DeltaService:
    """The delta publisher as a Service (server/core/api.py); its hook only counts and ticks."""

    def __init__(self, context: ServerContext, dense: DenseStore, sparse, log_dir: str, seconds: float = 2.0,
                 updates: int = 0, snapshot_every: int = 50, fp16: bool = False, dense_threshold: float = 0.0,
                 clock=time.monotonic):
        self.ctx, self.dense, self.sparse = context, dense, sparse
        self.log = DeltaLog(log_dir)
        self.seconds, self.updates, self.snapshot_every = seconds, updates, snapshot_every
        self.fp16, self.dense_threshold, self.clock = fp16, dense_threshold, clock
        self.watches: dict[str, TableWatch] = {}
        self.dense_sent: dict[str, np.ndarray] = {}      # block -> its values when last published
        entries = self.log.entries(context.server_id)
        # A server restarted in place goes on after what its predecessor published, with a snapshot.
        self.next_seq = entries[-1].seq + 1 if entries else 0
        self.base_due = True          # the next publication is a snapshot (begin, restart, rollback)
        self.deltas_since_snapshot = 0
        self.pushes = 0
        self.last = clock()
        self.last_created = 0.0
        self.writer: threading.Thread | None = None
        self.failure: BaseException | None = None
        self.counts = PublishedCounts()      # what was published: the stats reply's DeltaStats
        self._hook = DeltaHook(self)

    # -- Service ------------------------------------------------------------------------------
    def ops(self) -> dict:
        return {}

    def hooks(self) -> list:
        return [self._hook]

    def stats(self):
        return self.counts.part(self.clock())

    @property
    def published(self) -> dict:
        return self.counts.published()

    def on_leave(self, trainer: int) -> None:
        pass

    def reset(self) -> None:
        """A rollback: every row and block goes, the checkpoint's come back: a snapshot next."""
        self.watches, self.dense_sent = {}, {}
        self.base_due = True

    # -- what changed -------------------------------------------------------------------------
    def attach(self) -> None:
        """Watch every table; a table not watched yet has all its rows changed."""
        for name, table in (self.sparse.tables.items() if self.sparse is not None else ()):
            watch = self.watches.get(name)
            if watch is None or table.watch is not watch:
                watch = self.watches[name] = TableWatch()
                table.watch = watch
                watch.changed(table.ids_by_row())

    def _ownership(self):
        for service in self.ctx.services:
            ownership = getattr(service, "ownership", None)
            if ownership is not None and ownership.elastic:
                return ownership
        return None

    def _holds_anything(self) -> bool:
        return self.dense.registered or bool(self.sparse is not None and self.sparse.tables)

    def step(self) -> int:
        """This server's progress: sync, completed steps; async, the most pushes a table or block took."""
        tables = self.sparse.tables.values() if self.sparse is not None else ()
        return max([t.version for t in tables] + [b.version for b in self.dense.blocks.values()], default=0)

    def due(self) -> bool:
        return (self.clock() - self.last >= self.seconds or (self.updates > 0 and self.pushes >= self.updates)
                or self.ctx.membership.job_over())

    def maybe_publish(self) -> None:
        if self.failure is not None or self.ctx.epoch < 0 or not self._holds_anything() or not self.due():
            return
        self.last, self.pushes = self.clock(), 0
        if not self._writer_done():
            return
        self.attach()
        started = self.clock()
        if self.base_due:
            self.base_due = False
            self._snapshot(self.next_seq, started)
            self.next_seq += 1
        else:
            delta = self._delta()
            if delta is not None:
                self._write(delta, started)
                self.next_seq += 1
                self.deltas_since_snapshot += 1
                if self.deltas_since_snapshot >= self.snapshot_every:
                    self._snapshot(delta.seq, self.clock())      # the seq of the delta it completes
        if self.ctx.membership.job_over():
            self.flush()             # the server stops next: its last files are written whole first

    def _writer_done(self) -> bool:
        writer = self.writer
        if writer is None:
            return True
        writer.join(self.ctx.timeout)
        if writer.is_alive():
            log.warning("%s: a snapshot is still being written after %g s (PARAMSHARD_TIMEOUT); "
                        "no delta until it is done: is %s full or slow?", self.ctx.name,
                        self.ctx.timeout, self.log.root)
            return False
        self.writer = None
        if self.failure is not None:
            log.error("%s: publishing deltas stopped: %s", self.ctx.name, self.failure)
            return False
        return True

    # -- rows ---------------------------------------------------------------------------------
    def _values(self, values: np.ndarray) -> np.ndarray:
        return values.astype(np.float16) if self.fp16 else values

    def _table_delta(self, table, watch: TableWatch, ownership) -> TableChange | None:
        changed, evicted = watch.take()
        if not len(changed) and not len(evicted):
            return None
        handles = table.store.lookup(changed)
        present = handles >= 0
        if ownership is not None:
            parts = ownership.partitions(changed)
            owned = ownership.owned[parts]
            publishable = owned & ~ownership.copying[parts]
            watch.keep(changed[present & ~publishable])   # staged here, or being copied out: not yet
        else:
            owned = publishable = np.ones(len(changed), bool)
        send = present & publishable
        ids = changed[send]
        gone = np.concatenate([changed[~present & owned], evicted[table.store.lookup(evicted) < 0]])
        gone = np.asarray(pd.unique(gone), np.uint64) if len(gone) else _EMPTY
        if not len(ids) and not len(gone):
            return None
        return TableChange(ids, self._values(table.store.gather(handles[send])), gone, table.version)

    def _dense_changed(self) -> dict[str, np.ndarray]:
        out = {}
        for name, block in self.dense.blocks.items():
            if name in self.dense.handed_away:
                continue
            sent = self.dense_sent.get(name)
            if sent is not None and sent.shape == block.values.shape:
                if self.dense_threshold > 0:
                    scale = float(np.linalg.norm(sent)) or 1.0
                    if float(np.linalg.norm(block.values - sent)) <= self.dense_threshold * scale:
                        continue
                elif np.array_equal(sent, block.values):
                    continue
            out[name] = self.dense_sent[name] = block.values.copy()
        return out

    def _delta(self) -> Delta | None:
        ownership = self._ownership()
        tables = {}
        for name, table in self.sparse.tables.items() if self.sparse is not None else ():
            change = self._table_delta(table, self.watches[name], ownership)
            if change is not None:
                tables[name] = change
        dense = self._dense_changed()
        if not tables and not dense:
            return None
        return Delta("delta", self.ctx.server_id, self.next_seq, self.step(), self._created(), tables, dense)

    def _created(self) -> float:
        """The file's time, never before the previous file's (a clock set back): followers merge the
        servers' files in order of it (online/delta_log.py), each server's in seq order."""
        self.last_created = max(time.time(), self.last_created + 1e-6)
        return self.last_created

    def _snapshot(self, seq: int, started: float) -> None:
        """All this server serves, copied now, written by a background thread."""
        ownership = self._ownership()
        tables = {}
        for name, table in self.sparse.tables.items() if self.sparse is not None else ():
            watch = self.watches[name]
            changed, _ = watch.take()
            ids, values = table.export()
            if ownership is not None:
                parts = ownership.partitions(ids)
                mine = ownership.owned[parts]
                ids, values = ids[mine], values[mine]
                pending = changed[table.store.lookup(changed) >= 0]
                parts = ownership.partitions(pending)
                watch.keep(pending[~(ownership.owned[parts] & ~ownership.copying[parts])])
            tables[name] = TableChange(ids, self._values(values), _EMPTY, table.version)
        dense = {}
        for name, block in self.dense.blocks.items():
            if name not in self.dense.handed_away:
                dense[name] = self.dense_sent[name] = block.values.copy()
        snapshot = Delta("snapshot", self.ctx.server_id, seq, self.step(), self._created(), tables, dense)
        self.deltas_since_snapshot = 0
        self.writer = threading.Thread(target=self._write_snapshot, args=(snapshot, started),
                                       name=f"{self.ctx.name} snapshot {snapshot.seq}", daemon=True)
        self.writer.start()

    def _write_snapshot(self, snapshot: Delta, started: float) -> None:
        try:
            self._write(snapshot, started)
            self.log.prune(snapshot.server, KEEP_SNAPSHOTS)
        except BaseException as exc:      # noqa: BLE001 - reported by the loop's thread (_writer_done)
            self.failure = exc

    def _write(self, delta: Delta, started: float) -> None:
        """Publish ``delta``, taken at ``started`` (the clock's): counted once durable."""
        path = self.log.publish(delta)
        now = self.clock()
        self.counts.note(delta, path.stat().st_size, now - started, now)

    def flush(self) -> None:
        """Wait for a snapshot being written (tests, and a server about to stop)."""
        self._writer_done()


class DeltaHook:
    """Counts pushes and publishes when due, between two requests (server/core/hooks.py)."""

    def __init__(self, service: DeltaService):
        self.service = service

    def admit(self, request: Incoming) -> Verdict:
        return Verdict.ACCEPT

    def applied(self, request: Incoming) -> None:
        service = self.service
        if request.op in PUSH_OPS:
            service.pushes += 1
        service.attach()             # a new table's rows are watched from the request that made it on
        service.maybe_publish()      # a server without a socket loop (in-process) has no tick

    def tick(self) -> None:
        self.service.maybe_publish()


def attach_deltas(server, env: ClusterEnv, sparse) -> DeltaService | None:
    """The delta publisher of a server with PARAMSHARD_DELTA_DIR set (None without)."""
    if not env.delta_dir:
        return None
    service = DeltaService(server.context, server.dense, sparse, env.delta_dir, seconds=env.delta_seconds,
                           updates=env.delta_updates, snapshot_every=env.delta_snapshot_every, fp16=env.delta_fp16,
                           dense_threshold=env.delta_dense_threshold)
    server.add_service(service)
    return service


if TYPE_CHECKING:   # `make typecheck` checks the contract: Service (server/core/api.py), RequestHook (server/core/hooks.py)
    from paramshard.server.core.api import Service
    from paramshard.server.core.hooks import RequestHook
    _service: type[Service] = DeltaService
    _hook: type[RequestHook] = DeltaHook
