"""GEO mode (GEO-SGD, local SGD): each trainer trains a local replica and every k steps sends
the change of what it touched.

The replica (geo/replica.py) holds the dense parameters (the Trainer's own tensors) and the rows
this trainer read, trained with the model's optimizer as the servers would apply it. A *round*
is k local steps, then the send: the deltas ``(local - synced) / n`` of the dense blocks and of
the rows touched go to the servers as one push (which they add: they hold SGD(lr=1.0) in geo
mode, ``SERVER_OPTIMIZER``), the merged dense values come back in its reply, and the touched rows
are pulled (after the push, on each connection). The merge *lands*: "last synced" becomes the
merged values and local the merged values plus what was trained since the send. With
``--geo-send blocking`` that is at once (nothing was trained since); ``overlapped`` (the
default) trains on, and lands it at the first step boundary at which every reply is in. One
round is out at a time, and one not in when the replica reaches the bound is waited for. k
comes from the job's GeoSchedule (geo/choose.py): each landed round is measured into a
``Round`` and the schedule picks the next k, never over its bound (``--max-staleness``).

The servers' clients are a ServerBackend's (composition: its start, checkpoints, barriers and
rollback are used as they are, with the servers' optimizer in place of the model's).
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import time
from typing import TYPE_CHECKING, Callable

import numpy as np

from paramshard.client.step import FETCHES_PER_TABLE
from paramshard.env import ClusterEnv
from paramshard.errors import ConfigError
from paramshard.geo import trainer_state
from paramshard.geo.choose import schedule_for
from paramshard.geo.flight import Flight, SentRows
from paramshard.geo.pacing import Pacer
from paramshard.geo.records import RoundRecords
from paramshard.geo.replica import DenseReplica, TableReplica
from paramshard.geo.schedule import GeoSchedule, Round
from paramshard.log import get_logger
from paramshard.optim import SGD
from paramshard.trainer.backends.row_source import RowSource
from paramshard.trainer.backends.servers import ServerBackend

if TYPE_CHECKING:
    from paramshard.trainer.progress import TrainerProgress

log = get_logger("trainer")

# What the servers hold in geo mode, for the dense blocks and every table: a round's push carries
# -delta, and value - 1.0 * (-delta) == value + delta exactly in float32 (no weight decay, no
# state). An explicit "merge" op on the servers would say the same thing with a new wire op and
# server code; this needs none, and checkpoints, exports and restores work unchanged.
SERVER_OPTIMIZER = SGD(lr=1.0)



def server_specs(tables):
    """The tables as the servers hold them in geo mode: the same rows, SERVER_OPTIMIZER."""
    return {name: dataclasses.replace(spec, optimizer=SERVER_OPTIMIZER) for name, spec in tables.items()}


class GeoBackend:
    def __init__(self, env: ClusterEnv, servers: ServerBackend, schedule: GeoSchedule):
        self.env, self.mode, self.trainer_id = env, env.mode, env.trainer_id
        self.servers, self.schedule = servers, schedule
        self.k = schedule.first_k()
        self.dense: DenseReplica          # set by start(): a push before it is a bug
        self.tables: dict[str, TableReplica] = {}
        self.steps_in_round = 0
        self.rounds = 0
        self._step = 0          # the trainer's step count after its latest local step
        self._round_started = time.perf_counter()
        # Called after each round with (Round, next k, the trainer's step): the run directory's
        # records of k, bytes and staleness. None: nobody listens.
        self.on_round: Callable[[Round, int, int], None] | None = None
        self.last_round: Round | None = None
        self.records: RoundRecords | None = None
        self._ahead: dict[str, collections.deque] = {}     # table -> (batch ids, ids fetched ahead)
        self.overlapped = env.geo_send == "overlapped"
        self._flight: Flight | None = None       # the round on the wire (overlapped: until it lands)
        self._last_push_step = -1        # every push carries a step number over this one (geo/flight.py)
        self._pacer = Pacer()            # the rows of each piece of an overlapped round (geo/pacing.py)
        # The step of the send whose merge the replica holds (None: set at the next local step).
        self._merged_at: int | None = None
        self._lr_scales: dict[str, float] = {}      # "dense" and table names -> scale_learning_rate's product

    @classmethod
    def connect(cls, env: ClusterEnv, params, **_) -> "GeoBackend":
        schedule = schedule_for(env)       # before any socket: a bad --geo-k leaves nothing behind
        backend = cls(env, ServerBackend.connect(env, params, max_in_flight=0), schedule)
        # The run directory's geo_round records (geo/records.py), when the launcher asks for records.
        backend.records = RoundRecords.for_env(env)
        if backend.records is not None:
            backend.on_round = backend.records.add
        return backend

    # -- what the servers' backend has ------------------------------------------
    links = property(lambda self: self.servers.links)
    plan = property(lambda self: self.servers.plan)
    steps = property(lambda self: self.servers.steps)
    sparse = property(lambda self: self.servers.sparse)
    stats = property(lambda self: self.servers.stats)

    @property
    def _sparse(self):
        return self.servers.steps.sparse

    # -- start ----------------------------------------------------------------
    def start(self, values, optimizer, tables, ckpt, is_chief: bool) -> int:
        if ckpt is not None and ckpt.manifest.get("mode") != self.mode:
            # Its servers hold the model's optimizer state, not geo's sums (and no trainer's own).
            raise ConfigError(f"{ckpt.path} was written in {ckpt.manifest.get('mode')} mode; a geo job resumes "
                              f"geo checkpoints only (the servers hold SGD(lr=1.0) and each trainer its own "
                              f"optimizer state): resume it with --mode {ckpt.manifest.get('mode')}")
        self._values = values           # the Trainer's parameters: the dense replica trains them in place
        version = self.servers.start(values, SERVER_OPTIMIZER, server_specs(tables), ckpt, is_chief)
        self._optimizer, self._specs = optimizer, dict(tables)
        self._fresh_replica(ckpt)
        return version

    def _fresh_replica(self, ckpt) -> None:
        """The replica of the values the servers hold now (the Trainer's parameters), with the
        optimizer state this trainer saved in ``ckpt`` (None: fresh state)."""
        self.dense = DenseReplica(self._values, self._optimizer)
        self.tables = {name: TableReplica(name, spec.dim, spec.optimizer) for name, spec in self._specs.items()}
        self._lr_scales = trainer_state.load(ckpt, self.trainer_id, self.dense, self.tables) if ckpt else {}
        if "dense" in self._lr_scales:
            self.dense.set_lr_scale(self._lr_scales["dense"])
        for name, replica in self.tables.items():
            if name in self._lr_scales:
                replica.set_lr_scale(self._lr_scales[name])
        self.steps_in_round = 0
        self._ahead.clear()
        self._round_started = time.perf_counter()
        self._merged_at = None       # set at the next local step: the replica holds the servers' values now

    # -- versions: the servers apply rounds as they come ---------------------------
    def row_version(self, step: int) -> int:
        return 0

    def step_of_version(self, version: int) -> int | None:
        return None

    def fresh_after(self, current_ids, fresh_rows: bool):
        return None

    # -- steps ------------------------------------------------------------------
    def pull_dense(self, values, min_version: int) -> int:
        """The servers' current merged values (Trainer.pull: this trainer's round is sent first):
        the dense ones now, every held row at its next read."""
        self.flush()
        version = self.servers.pull_dense(values, 0)
        self.dense.merged({name: 0.0 for name in self.dense.values})     # the round went out: nothing in flight
        for replica in self.tables.values():
            replica.forget()
        self._merged_at = None
        return version

    def rows(self, table, ids, dim, step, create):
        replica = self.tables[table]
        if create:
            self._piece_answered()      # a piece's round trip, seen within half a step (geo/pacing.py)
            self._take_ahead(table, ids, dim)
        stale = replica.stale(ids)
        if not create:
            # Evaluation: held rows as this trainer has them, the others read without creating them.
            out = np.empty((len(ids), dim), np.float32)
            if (~stale).any():
                out[~stale] = replica.read(ids[~stale])
            if stale.any():
                out[stale] = self._sparse.pull_sparse(table, ids[stale], dim, 0, create=False)
            return out
        if stale.any():
            started = time.perf_counter()
            wanted = ids[stale]
            replica.put(wanted, self._sparse.pull_sparse(table, wanted, dim, 0, create=True))
            self.stats["pulls"] += 1
            self.stats["pull_wait_s"] += time.perf_counter() - started
        return replica.read(ids)

    def row_source(self, table: str, dim: int, progress: TrainerProgress) -> RowSource:
        return RowSource(self, table, dim, progress)

    def prefetch(self, table, ids, step, fresh_after) -> None:
        """Pull now the rows of a coming batch the replica lacks (or holds a round old); its
        forward puts them into the replica, those it touched meanwhile excepted (rows.py)."""
        wanted = ids[self.tables[table].stale(ids)]
        if len(wanted):
            self.servers.steps.prefetch(table, wanted, 0)
            self._ahead.setdefault(table, collections.deque(maxlen=FETCHES_PER_TABLE)).append((ids, wanted))

    def _take_ahead(self, table: str, ids: np.ndarray, dim: int) -> None:
        queue = self._ahead.get(table)
        if not queue:
            return
        entry = next((e for e in queue if e[0] is ids), None)
        if entry is None:
            return
        queue.remove(entry)
        wanted = entry[1]
        rows = self.servers.steps.rows(table, wanted, dim, 0, True)      # the prefetched reply
        # A row trained since it was fetched (a round may have merged it, or this round touched
        # it) keeps what the replica holds: the fetched copy is older, and would drop local steps.
        replica = self.tables[table]
        still = replica.stale(wanted)
        replica.put(wanted[still], rows[still])

    def forget_fetches(self) -> None:
        self._ahead.clear()
        self.servers.forget_fetches()

    def unused_in_a_row(self, table: str) -> int:
        return self.servers.unused_in_a_row(table)

    def push(self, grads, sparse_grads, step, values) -> None:
        """One local step; then, at this step boundary, the round on the wire goes on (its next
        piece, or its landing) and the round is sent when it is due."""
        if self._merged_at is None:
            self._merged_at = step
        self.dense.apply(grads)
        for table, ids, table_grads in sparse_grads:
            self.tables[table].apply(ids, table_grads)
        self.steps_in_round += 1
        self._step = step + 1
        self._pacer.boundary(time.perf_counter())
        if self._flight is not None:
            self._advance()
        if self.steps_in_round >= self.k:
            self.send_round(self._step)      # a round still on the wire is finished first

    def _advance(self) -> None:
        """At a step boundary, with a round on the wire: if the replica would pass the bound at
        the next step, the rest of the round goes now and its merge is waited for; else, once the
        piece sent is answered, the next piece goes (one per boundary, its rows from the pacer:
        geo/pacing.py), or the round lands."""
        flight = self._flight
        assert flight is not None
        merged_at = self._step if self._merged_at is None else self._merged_at
        if self._step - merged_at >= self.schedule.bound:
            self._finish_flight()
            return
        if not self._piece_answered():
            return
        if not flight.unsent:
            self._land()
        elif self._step > self._last_push_step:
            self._send_piece(flight, self._pacer.piece_rows(flight.rows, self.k))

    def _piece_answered(self) -> bool:
        """Whether the latest piece of the round on the wire is answered (taking the replies that
        came, without waiting); the first time it is, the pacer learns its round trip."""
        flight = self._flight
        if flight is None:
            return False
        if flight.piece_answered_at is None and flight.answered(self.servers.steps):
            flight.piece_answered_at = time.perf_counter()
            self._pacer.answered(flight.piece_answered_at - flight.piece_sent_at)
        return flight.piece_answered_at is not None

    def _send_piece(self, flight: Flight, rows: int) -> None:
        started = time.perf_counter()
        push_step = max(self._step, self._last_push_step + 1)
        flight.send_piece(self.servers.steps, rows, push_step, started)
        self._last_push_step = push_step
        flight.blocked += time.perf_counter() - started

    def _finish_flight(self) -> None:
        """The rest of the round on the wire goes in one piece, and its merge lands (waiting)."""
        flight = self._flight
        assert flight is not None
        if flight.unsent:
            self._send_piece(flight, flight.rows)
        self._land()

    def send_round(self, step: int) -> None:
        """Send this round (``step``: the trainer's step count): its deltas and the pull of its
        rows, in pieces (geo/flight.py). ``--geo-send blocking``: all of it, and its merge is
        waited for now; ``overlapped``: the first piece, and the rest at the step boundaries to
        come (``_advance``). One round is out at a time: one still on the wire is finished first
        (the rest of it at once, and its merge waited for), so every round is k steps."""
        if self.steps_in_round == 0:
            return
        if self._flight is not None:
            self._finish_flight()
        compute = time.perf_counter() - self._round_started
        started = time.perf_counter()
        # n: the job's trainer slots (MAX of --trainers MIN:MAX), fixed for the job's life, not the
        # trainers running now: a live count could change under a round already computed, and
        # every delta stays exact to sum (docs/modes.md, GEO: elastic trainers).
        n = self.env.num_trainers
        dense_grads, delta_sq = self.dense.round_delta(n)
        tables = []
        for replica in self.tables.values():
            pos, ids, grads, sq = replica.round_delta(n)
            delta_sq += sq
            tables.append(SentRows(replica, pos, ids, grads, replica.sent(pos)))
        if self.overlapped:
            # The reply's merged dense values go beside the parameters, which train on meanwhile.
            at_send, merged = self.dense.local_copy(), {name: np.empty_like(v) for name, v in self.dense.values.items()}
        else:
            at_send, merged = None, None          # the reply writes the parameters: nothing trains meanwhile
        dense_bytes = sum(g.nbytes for g in dense_grads.values())
        rows_bytes = sum(len(t.ids) * (8 + 4 * t.replica.dim) for t in tables)
        flight = Flight(step=step, steps=self.steps_in_round, compute=compute, started=started, blocked=0.0,
                        bytes_sent=2 * (dense_bytes + rows_bytes), delta_sq=delta_sq, dense_grads=dense_grads,
                        dense_into=self.dense.values if merged is None else merged, dense_merged=merged,
                        dense_at_send=at_send, tables=tables)
        self._flight = flight
        self.rounds += 1
        self.steps_in_round = 0
        self._send_piece(flight, self._pacer.piece_rows(flight.rows, self.k) if self.overlapped else flight.rows)
        flight.blocked = time.perf_counter() - started      # making the deltas, and the first piece
        self._round_started = time.perf_counter()
        if not self.overlapped:
            self._finish_flight()

    def _land(self) -> None:
        """The round on the wire, every piece sent (waiting for their replies): the merged values
        become synced, and local = merged + what was trained since the send; the schedule gets
        the measured round and picks the next k."""
        flight = self._flight
        assert flight is not None and not flight.unsent, "_land with a round not all sent"
        steps = self.servers.steps
        started = time.perf_counter()
        steps.flush()        # the pushes' replies: the merged dense values are in flight.dense_into
        norms = self.dense.merged(flight.dense_grads, flight.dense_merged, flight.dense_at_send)
        for table in flight.tables:
            norms = norms + table.replica.merged(table.pos, flight.merged_rows(steps, table), table.grads,
                                                 table.at_send)
        self._flight = None
        now = time.perf_counter()
        blocked = now - started
        if self.steps_in_round:
            self._round_started += blocked      # waiting is no step's compute
        # How far behind the merged values the replica had fallen: its steps since the send whose
        # merge it held (the previous round's), up to this landing.
        staleness = self._step - (flight.step - flight.steps if self._merged_at is None else self._merged_at)
        self._merged_at = flight.step
        done = Round(steps=flight.steps, compute_seconds=flight.compute, wire_seconds=now - flight.started,
                     bytes_sent=flight.bytes_sent, delta_norm=float(np.sqrt(flight.delta_sq)),
                     value_norm=float(np.sqrt(norms.value_sq)), drift_norm=float(np.sqrt(norms.drift_sq)),
                     settled_value_norm=float(np.sqrt(norms.settled_value_sq)),
                     settled_drift_norm=float(np.sqrt(norms.settled_drift_sq)),
                     blocked_seconds=flight.blocked + blocked, staleness=staleness, pieces=flight.pieces)
        self.k = self.schedule.next_k(done)
        if not 1 <= self.k <= self.schedule.bound:
            raise AssertionError(f"the GEO schedule returned k={self.k}, outside 1..{self.schedule.bound}")
        self.last_round = done
        if self.on_round is not None:
            self.on_round(done, self.k, flight.step)

    def _drop_flight(self) -> None:
        """A round on the wire is forgotten (a rollback voids it, the job ends): its pulls' late
        replies are dropped (the pushes' go with ServerBackend's), its pieces not sent are not."""
        if self._flight is not None:
            self._flight.discard(self.servers.steps)
            self._flight = None

    @contextlib.contextmanager
    def paused(self):
        """Time spent inside (an evaluation between two steps) is no round's compute: the
        schedule would read it as slow steps and, under ``--geo-k auto``, shrink k."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self._round_started += time.perf_counter() - started
            self._pacer.paused(time.perf_counter() - started)

    def staleness(self) -> int | None:
        return None

    def flush(self) -> None:
        """Every local step is on the servers and merged: the round on the wire goes whole and
        lands, the round so far is sent and lands."""
        if self._flight is not None:
            self._finish_flight()
        self.servers.flush()
        self.send_round(self._step)      # nothing before the first local step
        if self._flight is not None:
            self._finish_flight()

    # -- coordination, checkpoints --------------------------------------------
    def barrier(self, name, count, timeout, resumed) -> None:
        self.flush()
        self.servers.barrier(name, count, timeout, resumed)

    def broadcast(self, name, count, value, timeout, resumed):
        self.flush()
        return self.servers.broadcast(name, count, value, timeout, resumed)

    def scale_learning_rate(self, factor, dense, tables, step) -> None:
        # The rates are the replicas' (every trainer calls it at the same step); the servers add.
        scales = self._lr_scales
        if dense:
            scales["dense"] = scales.get("dense", 1.0) * factor
            self.dense.set_lr_scale(scales["dense"])
        for name in tables:
            scales[name] = scales.get(name, 1.0) * factor
            self.tables[name].set_lr_scale(scales[name])

    def save(self, tables, directory, step, settings, keep):
        return self.servers.save(server_specs(tables), directory, step, {**settings, "geo": True}, keep)

    def save_own(self, directory, step) -> None:
        trainer_state.save(directory, step, self.trainer_id, self.dense, self.tables, self._lr_scales)

    def roll_back(self, values, optimizer, tables, checkpoint_dir, is_chief, timeout):
        # The round in progress belongs to the epoch rolled back: it is dropped, not sent; the
        # optimizer state goes back to what this trainer saved with the checkpoint.
        self._drop_flight()
        ckpt, version = self.servers.roll_back(values, SERVER_OPTIMIZER, server_specs(tables), checkpoint_dir,
                                               is_chief, timeout)
        self._fresh_replica(ckpt)
        return ckpt, version

    def explain_failure(self, exc, step):
        return None

    def server_stats(self) -> list[dict]:
        return self.servers.server_stats()

    def export_table(self, name):
        self.flush()         # the rows this trainer trained are on the servers first
        return self.servers.export_table(name)

    def import_table(self, name, ids, values) -> None:
        self.servers.import_table(name, ids, values)

    # -- end --------------------------------------------------------------------------
    def leave(self, timeout: float) -> None:
        self.flush()
        self.servers.leave(timeout)

    def hang_up(self) -> None:
        try:
            self._drop_flight()
            self.servers.hang_up()
        finally:
            if self.records is not None:
                self.records.close()


if TYPE_CHECKING:   # `make typecheck` checks the contract: TrainerBackend (trainer/backends/base.py)
    from paramshard.trainer.backends.base import TrainerBackend
    _trainer_backend: type[TrainerBackend] = GeoBackend
