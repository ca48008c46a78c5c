"""One sparse table partition on one server: rows created on first pull,
updated row by row with per-row optimizer state.

Sync mode: step k's pushes from every live trainer are gathered, duplicate ids
merged and averaged over trainers, and applied once; pulls for step k+1 wait
for that. Async mode: each push is applied on arrival.
"""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from ..optim import OptimizerConfig
from ..rows import merge_duplicates
from ..sparse_hash import admitted_by_probability, initial_rows
from ..tables import Admission, Eviction
from .id_index import IdIndex
from .optimizers import make_rule

GROWTH = 1.25   # row storage grows by a quarter: little slack at 10^8 rows


class SparseTable:
    def __init__(self, name: str, dim: int, seed: int, optimizer: OptimizerConfig, admission: Admission,
                 eviction: Eviction, init_scale: float, mode: str, live_trainers: set[int],
                 capacity: int = 1024):
        if dim < 1:
            raise ConfigError(f"table {name}: dim must be >= 1, got {dim}")
        self.name, self.dim, self.seed, self.mode = name, dim, seed, mode
        self.optimizer, self.admission, self.eviction, self.init_scale = optimizer, admission, eviction, init_scale
        self.rule = make_rule(optimizer)
        self.live_trainers = live_trainers            # shared with the server: leaving trainers drop out
        self.index = IdIndex(capacity)
        self.num_rows = 0
        self.values = np.empty((capacity, dim), np.float32)
        self.slots = self.rule.init_slots((capacity, dim))
        self.steps = np.zeros(capacity, np.uint32)    # per-row update count (Adam's bias correction)
        self.last_seen = np.zeros(capacity, np.uint32) if eviction.unseen_steps else None
        self.counts = IdIndex(16) if admission.min_count > 1 else None   # ids seen but not admitted
        self.count_values = np.zeros(16, np.uint32)
        self.version = 0                               # completed steps (sync) or pushes (async)
        self._pending: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.evicted = 0

    # -- rows -------------------------------------------------------------
    def _ensure_capacity(self, rows: int) -> None:
        cap = len(self.values)
        if rows <= cap:
            return
        new_cap = max(rows, int(cap * GROWTH) + 1)

        def grow(a):
            b = np.empty((new_cap,) + a.shape[1:], a.dtype)
            b[:self.num_rows] = a[:self.num_rows]
            return b
        self.values = grow(self.values)
        fresh_slots = self.rule.init_slots((new_cap - self.num_rows, self.dim))
        self.slots = [np.concatenate([s[:self.num_rows], f]) for s, f in zip(self.slots, fresh_slots)]
        self.steps = grow(self.steps)
        if self.last_seen is not None:
            self.last_seen = grow(self.last_seen)

    def _admit(self, ids: np.ndarray) -> np.ndarray:
        """Which of these new, distinct ids get a row now."""
        ok = admitted_by_probability(self.seed, ids, self.admission.probability)
        if self.counts is None:
            return ok
        rows = self.counts.lookup(ids)
        new = rows < 0
        if new.any():
            first = self.counts.size
            self.counts.insert(ids[new], np.arange(first, first + new.sum()))
            if self.counts.size > len(self.count_values):
                self.count_values = np.resize(self.count_values, int(self.counts.size * GROWTH) + 16)
                self.count_values[first:] = 0
            rows[new] = np.arange(first, first + new.sum())
        self.count_values[rows] += 1
        return ok & (self.count_values[rows] >= self.admission.min_count)

    def rows_for(self, ids: np.ndarray, create: bool) -> np.ndarray:
        """Row of each id (-1: not admitted). ``ids`` may repeat."""
        rows = self.index.lookup(ids)
        missing = rows < 0
        if create and missing.any():
            new_ids = np.unique(ids[missing])
            new_ids = new_ids[self._admit(new_ids)]
            if len(new_ids):
                first = self.num_rows
                self._ensure_capacity(first + len(new_ids))
                new_rows = np.arange(first, first + len(new_ids))
                self.index.insert(new_ids, new_rows)
                self.values[first:first + len(new_ids)] = initial_rows(self.seed, new_ids, self.dim,
                                                                        self.init_scale)
                self.steps[first:first + len(new_ids)] = 0
                if self.last_seen is not None:
                    self.last_seen[first:first + len(new_ids)] = self.version
                self.num_rows += len(new_ids)
                rows[missing] = self.index.lookup(ids[missing])
        return rows

    def pull(self, ids: np.ndarray) -> np.ndarray:
        rows = self.rows_for(ids, create=True)
        out = np.zeros((len(ids), self.dim), np.float32)
        have = rows >= 0
        if have.all():
            np.take(self.values, rows, axis=0, out=out)
        else:
            out[have] = self.values[rows[have]]
        if self.last_seen is not None:
            self.last_seen[rows[have]] = self.version
        return out

    # -- updates ----------------------------------------------------------
    def push(self, trainer: int, step: int, ids: np.ndarray, grads: np.ndarray) -> None:
        if grads.shape != (len(ids), self.dim):
            raise ConfigError(f"table {self.name}: gradients are {list(grads.shape)}, expected "
                              f"[{len(ids)}, {self.dim}] for {len(ids)} ids")
        if self.mode == "async":
            self._apply(*merge_duplicates(ids, grads), contributors=1)
            self.version += 1
            self._maybe_evict()
            return
        if trainer not in self.live_trainers:
            raise ConfigError(f"trainer {trainer} already left or is not part of this job")
        if step != self.version:
            raise ConfigError(f"trainer {trainer} pushed step {step} to table {self.name}, which is at "
                              f"step {self.version}; every trainer must push every step once")
        if trainer in self._pending:
            raise ConfigError(f"trainer {trainer} pushed step {step} to table {self.name} twice")
        self._pending[trainer] = (ids.copy(), grads.copy())
        self.maybe_finish_step()

    def maybe_finish_step(self) -> None:
        if not self._pending or not self.live_trainers <= set(self._pending):
            return
        parts = list(self._pending.values())
        ids = np.concatenate([p[0] for p in parts])
        grads = np.concatenate([p[1] for p in parts])
        self._apply(*merge_duplicates(ids, grads), contributors=len(parts))
        self._pending.clear()
        self.version += 1
        self._maybe_evict()

    def waiting_for(self) -> list[int]:
        return sorted(self.live_trainers - set(self._pending))

    def _apply(self, ids: np.ndarray, grads: np.ndarray, contributors: int) -> None:
        rows = self.index.lookup(ids)
        keep = rows >= 0                     # ids never admitted: their gradient is dropped
        rows, grads = rows[keep], grads[keep]
        if not len(rows):
            return
        values = self.values[rows]
        slots = [s[rows] for s in self.slots]
        steps = self.steps[rows] + 1
        self.rule.apply(values, grads, slots, steps[:, None], scale=1.0 / contributors)
        self.values[rows] = values
        for s, new in zip(self.slots, slots):
            s[rows] = new
        self.steps[rows] = steps

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
        self.steps[:len(kept)] = self.steps[kept]
        self.last_seen[:len(kept)] = self.last_seen[kept]
        self.index.rebuild(ids_by_row[kept])

    def ids_by_row(self) -> np.ndarray:
        keys, rows = self.index.items()
        out = np.empty(self.num_rows, np.uint64)
        out[rows] = keys
        return out

    def export(self) -> tuple[np.ndarray, np.ndarray]:
        return self.ids_by_row(), self.values[:self.num_rows].copy()

    def load(self, ids: np.ndarray, values: np.ndarray) -> None:
        """Set rows from an exported table (creating them, admission bypassed)."""
        if values.shape != (len(ids), self.dim):
            raise ConfigError(f"table {self.name}: import of {list(values.shape)} rows, dim is {self.dim}")
        rows = self.index.lookup(ids)
        new = rows < 0
        if new.any():
            first = self.num_rows
            self._ensure_capacity(first + int(new.sum()))
            self.index.insert(ids[new], np.arange(first, first + new.sum()))
            self.num_rows += int(new.sum())
            rows = self.index.lookup(ids)
            if self.last_seen is not None:
                self.last_seen[rows] = self.version
        self.values[rows] = values

    @property
    def nbytes(self) -> int:
        per_row = [self.values, *self.slots, self.steps] + ([self.last_seen] if self.last_seen is not None else [])
        counts = self.counts.nbytes + self.count_values.nbytes if self.counts is not None else 0
        return sum(a.nbytes for a in per_row) + self.index.nbytes + counts
