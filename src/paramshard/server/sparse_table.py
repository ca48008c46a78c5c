"""One sparse table partition on one server: rows created on first pull,
updated row by row with per-row optimizer state.

Sync mode: step k's pushes from every live trainer are gathered, duplicate ids
merged and averaged over trainers, and applied once; pulls for step k+1 wait
for that. Async mode: each push is applied on arrival.
"""
from __future__ import annotations

import collections
import itertools
import time

import numpy as np
import pandas as pd

from ..errors import ConfigError
from ..limits import Limits
from ..optim import OptimizerConfig
from ..rows import merge_duplicates
from ..sparse_hash import admitted_by_probability, initial_rows
from ..tables import Admission, Eviction, check_table_settings
from .barrier import Membership, StepBarrier
from .id_index import IdIndex
from ..update_rules import make_rule

GROWTH = 1.25   # row storage grows by a quarter: little slack at 10^8 rows


def put_rows(table: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
    """table[rows] = values, with each row moved as one item (faster than fancy assignment)."""
    row_type = np.dtype((np.void, table.shape[1] * table.itemsize))
    np.put(table.view(row_type).reshape(-1), rows, np.ascontiguousarray(values).view(row_type).reshape(-1),
           mode="clip")


class SparseTable:
    def __init__(self, name: str, dim: int, seed: int, optimizer: OptimizerConfig, admission: Admission,
                 eviction: Eviction, init_scale: float, mode: str, membership: Membership,
                 limits: Limits = Limits(), capacity: int = 1024):
        check_table_settings(name, dim, seed, init_scale)
        limits.check("max_dim", dim, f"table {name!r}: dim")
        self.name, self.dim, self.seed, self.mode, self.limits = name, dim, seed, mode, limits
        self.optimizer, self.admission, self.eviction, self.init_scale = optimizer, admission, eviction, init_scale
        self.rule = make_rule(optimizer)
        self._slot_initials = self.rule.init_slots((1, dim))     # a new row's optimizer state
        self.membership = membership
        self.barrier = StepBarrier(membership, f"table {name!r}")
        self.index = IdIndex(capacity)
        self.num_rows = 0
        self.values = np.empty((capacity, dim), np.float32)
        self.slots = self.rule.init_slots((capacity, dim))
        # Per-row update counts, kept only for rules that read them (Adam's bias correction).
        self.steps = np.zeros(capacity, np.uint32) if self.rule.uses_step else None
        self.last_seen = np.zeros(capacity, np.uint32) if eviction.unseen_steps else None
        self.counts = IdIndex(16) if admission.min_count > 1 else None   # ids seen but not admitted
        self.count_values = np.zeros(16, np.uint32)
        self.version = 0                               # completed steps (sync) or pushes (async)
        self._pending: dict[int, tuple[np.ndarray, np.ndarray]] = {}   # trainer -> (rows, grads)
        # trainer -> (ids, rows); trainer ids are checked against the job, so this stays small.
        # A few per trainer: a trainer that prefetches pulls batch k+1 (in up to two pieces)
        # before and around its push of batch k.
        self._last_pull: dict[int, collections.deque] = collections.defaultdict(lambda: collections.deque(maxlen=4))
        self.evicted = 0
        self.timings: collections.Counter = collections.Counter()    # seconds per phase (stats)
        self.rows_updated = 0

    # -- rows -------------------------------------------------------------
    def _ensure_capacity(self, rows: int) -> None:
        cap = len(self.values)
        if rows <= cap:
            return
        new_cap = min(max(rows, int(cap * GROWTH) + 1), max(rows, self.limits.max_rows))

        def grow(a):
            b = np.empty((new_cap,) + a.shape[1:], a.dtype)
            b[:self.num_rows] = a[:self.num_rows]
            return b
        # Allocate everything before replacing anything: a MemoryError half way
        # must leave the table as it was, not with arrays of different lengths.
        values = grow(self.values)
        # Rows past num_rows stay untouched (their pages unmapped) until a row is created there
        # (_init_rows): reserving room costs address space, not memory.
        slots = [grow(s) for s in self.slots]
        steps = grow(self.steps) if self.steps is not None else None
        last_seen = grow(self.last_seen) if self.last_seen is not None else None
        self.values, self.slots, self.steps, self.last_seen = values, slots, steps, last_seen

    def _init_rows(self, start: int, stop: int) -> None:
        """Optimizer state, update counts and last-seen step of new rows start..stop-1."""
        for slot, initial in zip(self.slots, self._slot_initials):
            slot[start:stop] = initial
        if self.steps is not None:
            self.steps[start:stop] = 0
        if self.last_seen is not None:
            self.last_seen[start:stop] = self.version

    def reserve(self, rows: int) -> None:
        """Room for ``rows`` rows now, so filling the table never copies it to grow."""
        self._ensure_capacity(rows)
        self.index.reserve(rows)

    def _admit(self, ids: np.ndarray) -> np.ndarray:
        """Which of these new, distinct ids get a row now."""
        ok = admitted_by_probability(self.seed, ids, self.admission.probability)
        if self.counts is None:
            return ok
        rows = self.counts.lookup(ids)
        new = rows < 0
        if new.any():
            first = self.counts.size
            rows[new] = self.counts.insert(ids[new])
            if self.counts.size > len(self.count_values):
                self.count_values = np.resize(self.count_values, int(self.counts.size * GROWTH) + 16)
                self.count_values[first:] = 0
        self.count_values[rows] += 1
        return ok & (self.count_values[rows] >= self.admission.min_count)

    def rows_for(self, ids: np.ndarray, create: bool) -> np.ndarray:
        """Row of each id (-1: not admitted). ``ids`` may repeat."""
        rows = self.index.lookup(ids)
        missing = np.flatnonzero(rows < 0)
        if create and len(missing):
            new_ids, inverse = np.unique(ids[missing], return_inverse=True)
            admitted = self._admit(new_ids)
            row_of_new = np.full(len(new_ids), -1, np.int64)
            count = int(admitted.sum())
            if count:
                first = self.num_rows
                self.limits.check("max_rows", first + count, f"table {self.name!r}: rows on this server")
                # Rows exist before their ids enter the index: if anything fails
                # here, the index still maps only ids that have rows.
                fresh = initial_rows(self.seed, new_ids[admitted], self.dim, self.init_scale)
                self._ensure_capacity(first + count)
                row_of_new[admitted] = self.index.insert(new_ids[admitted])   # rows first..first+count-1
                self.values[first:first + count] = fresh
                self._init_rows(first, first + count)
                self.num_rows += count
            rows[missing] = row_of_new[inverse]
        return rows

    def pull(self, ids: np.ndarray, trainer: int | None = None, create: bool = True) -> np.ndarray:
        """Rows of ``ids``. ``create=False`` (evaluation) stores nothing: an id
        without a row reads what its first training pull would give it."""
        started = time.perf_counter()
        rows = self.rows_for(ids, create=create)
        looked_up = time.perf_counter()
        have = rows >= 0
        if have.all():
            out = np.take(self.values, rows, axis=0, mode="clip")   # clip: skips a bounds pass
        else:
            out = np.zeros((len(ids), self.dim), np.float32)
            out[have] = np.take(self.values, rows[have], axis=0, mode="clip")
            if not create and self.admission.min_count == 1:
                absent = np.flatnonzero(~have)
                fresh = absent[admitted_by_probability(self.seed, ids[absent], self.admission.probability)]
                out[fresh] = initial_rows(self.seed, ids[fresh], self.dim, self.init_scale)
        if self.last_seen is not None:
            self.last_seen[rows[have]] = self.version
        if trainer is not None and create and have.all():
            # The push that follows usually carries exactly these ids: keep their rows. (Not
            # when some are not admitted yet: a later pull may admit them, and then -1 is stale.)
            self._last_pull[trainer].append((ids.copy(), rows))
        self.timings["pull_lookup"] += looked_up - started
        self.timings["pull_gather"] += time.perf_counter() - looked_up
        return out

    def _rows_of_push(self, trainer: int, ids: np.ndarray) -> np.ndarray:
        recent = self._last_pull.get(trainer)
        if not recent:
            return self.index.lookup(ids)
        for i, (pulled, rows) in enumerate(recent):
            if np.array_equal(pulled, ids):
                del recent[i]
                return rows
        # A prefetching trainer pulls a batch in two pieces (the rows it is about to update come
        # after that update), with the next batch's first piece in between: the push's ids are
        # two earlier pulls' together, in another order.
        for i, j in itertools.combinations(range(len(recent)), 2):
            (ids_i, rows_i), (ids_j, rows_j) = recent[i], recent[j]
            if len(ids_i) + len(ids_j) != len(ids):
                continue
            where = pd.Index(np.concatenate([ids_i, ids_j])).get_indexer(ids)   # a hash of this batch only
            if (where >= 0).all():
                rows = np.concatenate([rows_i, rows_j])[where]
                del recent[j], recent[i]
                return rows
        return self.index.lookup(ids)

    # -- updates ----------------------------------------------------------
    def push(self, trainer: int, step: int, ids: np.ndarray, grads: np.ndarray, distinct: bool = False) -> None:
        """Row gradients. paramshard's trainers merge duplicate ids before pushing
        and say so (``distinct``), which spares the server a sort."""
        if grads.shape != (len(ids), self.dim):
            raise ConfigError(f"table {self.name}: gradients are {list(grads.shape)}, expected "
                              f"[{len(ids)}, {self.dim}] for {len(ids)} ids")
        self.membership.check_trainer(trainer)
        self.membership.check_not_left(trainer, "push again")
        if self.mode == "sync":
            self.barrier.check_arrival(trainer, step, self.version)
        started = time.perf_counter()
        if not distinct:
            ids, grads = merge_duplicates(ids, grads)
        elif len(ids) > 1 and pd.Index(ids).has_duplicates:   # a hash table: ~1 ms for 100k ids, a sort ~15
            raise ConfigError(f"table {self.name}: push_sparse says its ids are distinct but some repeat; "
                              f"merge duplicate ids (or send distinct=false and the server merges them)")
        rows = self._rows_of_push(trainer, ids)
        self._check_known(ids, rows)
        self.timings["push_lookup"] += time.perf_counter() - started
        if self.mode == "async":
            self._apply(rows, grads, contributors=1)
            self.version += 1
            self._maybe_evict()
            return
        self._pending[trainer] = (rows, grads.copy())
        self.barrier.arrive(trainer)
        self.maybe_finish_step()

    def _check_known(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """A gradient for an id without a row is dropped only when the policies explain
        it (not admitted, or evicted); otherwise the trainer never pulled it: an error."""
        missing = np.flatnonzero(rows < 0)
        if not len(missing) or self.eviction.unseen_steps:
            return
        unknown = ids[missing]
        unknown = unknown[admitted_by_probability(self.seed, unknown, self.admission.probability)]
        if self.counts is not None and len(unknown):
            unknown = unknown[self.counts.lookup(unknown) < 0]
        if len(unknown):
            raise ConfigError(f"table {self.name}: gradients for {len(unknown)} ids that were never pulled "
                              f"(e.g. {unknown[:3].tolist()}); pull rows before pushing their gradients")

    def maybe_finish_step(self) -> None:
        if not self.barrier.complete():
            return
        parts = list(self._pending.values())
        if len(parts) == 1:
            rows, grads = parts[0]
        else:   # several trainers touched the same rows: sum them (then the rule averages)
            rows, grads = merge_duplicates(np.concatenate([p[0] for p in parts]),
                                           np.concatenate([p[1] for p in parts]))
        self._apply(rows, grads, contributors=len(parts))
        self._pending.clear()
        self.barrier.reset()
        self.version += 1
        self._maybe_evict()

    def waiting_for(self) -> list[int]:
        return self.barrier.waiting_for()

    def _apply(self, rows: np.ndarray, grads: np.ndarray, contributors: int) -> None:
        keep = rows >= 0                     # ids never admitted: their gradient is dropped
        if not keep.all():
            rows, grads = rows[keep], grads[keep]
        if not len(rows):
            return
        started = time.perf_counter()
        values = np.take(self.values, rows, axis=0, mode="clip")
        slots = [np.take(s, rows, axis=0, mode="clip") for s in self.slots]
        if self.steps is not None:
            steps = self.steps[rows] + 1
            self.steps[rows] = steps
            step = steps[:, None]
        else:
            step = 1
        self.rule.apply(values, grads, slots, step, scale=1.0 / contributors)
        put_rows(self.values, rows, values)
        for s, new in zip(self.slots, slots):
            put_rows(s, rows, new)
        self.timings["push_optimizer"] += time.perf_counter() - started
        self.rows_updated += len(rows)

    # -- eviction and export ----------------------------------------------
    def _maybe_evict(self) -> None:
        n = self.eviction.unseen_steps
        if not n or self.version % max(1, n // 2):
            return
        stale = self.last_seen[:self.num_rows].astype(np.int64) < self.version - n
        if stale.any():
            self.evict(~stale)

    def evict(self, keep: np.ndarray) -> None:
        ids_by_row = self.ids_by_row()
        kept = np.flatnonzero(keep)
        self.evicted += self.num_rows - len(kept)
        self.num_rows = len(kept)
        self.values[:len(kept)] = self.values[kept]
        for s in self.slots:
            s[:len(kept)] = s[kept]
        if self.steps is not None:
            self.steps[:len(kept)] = self.steps[kept]
        self.last_seen[:len(kept)] = self.last_seen[kept]
        self.index.rebuild(ids_by_row[kept])
        self._last_pull.clear()                 # row numbers changed

    def ids_by_row(self) -> np.ndarray:
        return self.index.ids_by_row().copy()

    def export(self) -> tuple[np.ndarray, np.ndarray]:
        return self.ids_by_row(), self.values[:self.num_rows].copy()

    def load(self, ids: np.ndarray, values: np.ndarray) -> None:
        """Set rows from an exported table (creating them, admission bypassed)."""
        if values.shape != (len(ids), self.dim):
            raise ConfigError(f"table {self.name}: import of {list(values.shape)} rows, dim is {self.dim}")
        if len(np.unique(ids)) != len(ids):
            raise ConfigError(f"table {self.name}: an import names some ids twice; each id may appear once")
        rows = self.index.lookup(ids)
        new = rows < 0
        if new.any():
            first = self.num_rows
            self.limits.check("max_rows", first + int(new.sum()), f"table {self.name!r}: rows on this server")
            self._ensure_capacity(first + int(new.sum()))
            self.index.insert(ids[new])
            self._init_rows(first, first + int(new.sum()))
            self.num_rows += int(new.sum())
            rows = self.index.lookup(ids)
            if self.last_seen is not None:
                self.last_seen[rows] = self.version
        self.values[rows] = values

    @property
    def nbytes(self) -> int:
        per_row = [a for a in (self.values, *self.slots, self.steps, self.last_seen) if a is not None]
        counts = self.counts.nbytes + self.count_values.nbytes if self.counts is not None else 0
        return sum(a.nbytes for a in per_row) + self.index.nbytes + counts
