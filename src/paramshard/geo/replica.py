"""A GEO trainer's local replica: the dense values and the table rows it touched, what it last
synced of each, and its own optimizer state (trainer/backends/geo.py moves them on the wire).

The local update is the servers' own rule (update_rules.make_rule of the model's optimizer), so
one local step is exactly what a server would have done with the same gradient. A round's delta
is ``(local - synced) / n``; the servers add it (they hold SGD(lr=1.0) in geo mode, so
``value - 1.0 * (-delta)`` is ``value + delta`` exactly in float32), and the merged values come
back as the new ``synced``, and as the local values plus what was trained since the send:
``merged + (local now - local at send)``. A send that waits for its merge (``--geo-send
blocking``) trained nothing meanwhile: the local values are then the merged ones exactly. One
that does not (``overlapped``) keeps the steps it trained while the round was on the wire, and
they go out in the next round: every local change is sent exactly once either way.

Rows are kept once touched (with their optimizer slots and update counts, which are this
trainer's own). A row's *values* are trusted only in the round they were synced in: a row not
touched in a round is pulled again when it is next read (its values equal its ``synced``, so
nothing local is lost), which keeps every row a forward reads at most one round old.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from paramshard.errors import ConfigError
from paramshard.optim import OptimizerConfig, scaled
from paramshard.update_rules.rules import make_rule


@dataclasses.dataclass(frozen=True)
class MergeNorms:
    """Squared norms a merge measured: of the merged values and of the others' change (drift),
    over everything sent and over the settled values only (TableReplica.merged says which)."""
    value_sq: float
    drift_sq: float
    settled_value_sq: float
    settled_drift_sq: float

    def __add__(self, other: "MergeNorms") -> "MergeNorms":
        return MergeNorms(self.value_sq + other.value_sq, self.drift_sq + other.drift_sq,
                          self.settled_value_sq + other.settled_value_sq, self.settled_drift_sq + other.settled_drift_sq)


class IdIndex:
    """Position of each id in append order. A hash index over most ids, rebuilt when the ids
    appended since outgrow it (amortised O(1) per id), and a small one over those."""

    def __init__(self):
        self.ids = np.empty(0, np.uint64)
        self.n = 0
        self._main, self._main_n = pd.Index(np.empty(0, np.uint64)), 0
        self._tail = pd.Index(np.empty(0, np.uint64))

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        pos = self._main.get_indexer(ids)
        if self.n > self._main_n:
            missing = pos < 0
            if missing.any():
                tail = self._tail.get_indexer(ids[missing])
                pos[missing] = np.where(tail >= 0, tail + self._main_n, -1)
        return pos

    def add(self, new: np.ndarray) -> np.ndarray:
        """Append distinct ids not held yet; returns their positions."""
        start = self.n
        if self.n + len(new) > len(self.ids):
            grown = np.empty(max(2 * len(self.ids), self.n + len(new), 1024), np.uint64)
            grown[:self.n] = self.ids[:self.n]
            self.ids = grown
        self.ids[self.n:self.n + len(new)] = new
        self.n += len(new)
        if self.n - self._main_n > max(4096, self._main_n // 4):
            self._main, self._main_n = pd.Index(self.ids[:self.n].copy()), self.n
            self._tail = pd.Index(np.empty(0, np.uint64))
        else:
            self._tail = pd.Index(self.ids[self._main_n:self.n].copy())
        return np.arange(start, self.n)


class TableReplica:
    """One table's rows on this trainer."""

    def __init__(self, name: str, dim: int, optimizer: OptimizerConfig):
        self.name, self.dim, self.optimizer = name, dim, optimizer
        self.rule = make_rule(optimizer)
        self.index = IdIndex()
        self.values = np.empty((0, dim), np.float32)
        self.synced = np.empty((0, dim), np.float32)
        self.slots = self.rule.init_slots((0, dim))
        self.counts = np.zeros((0, 1), np.int64)        # this trainer's updates of each row (Adam's step)
        self.synced_round = np.zeros(0, np.int64)
        self.round = 1                                   # rows synced in this round are fresh
        self.touched: list[np.ndarray] = []              # positions updated this round

    @property
    def rows(self) -> int:
        return self.index.n

    def set_lr_scale(self, scale: float) -> None:
        self.rule = make_rule(scaled(self.optimizer, scale))

    def stale(self, ids: np.ndarray) -> np.ndarray:
        """Which of distinct ``ids`` must be pulled before a forward reads them."""
        pos = self.index.lookup(ids)
        out = pos < 0
        held = ~out
        out[held] = self.synced_round[pos[held]] != self.round
        return out

    def put(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """The servers' rows of distinct ``ids``: local values and synced both (a new row gets
        fresh optimizer slots; a held one keeps its own)."""
        pos = self.index.lookup(ids)
        new = pos < 0
        if new.any():
            pos[new] = self._grow(ids[new])
        self.values[pos] = rows
        self.synced[pos] = rows
        self.synced_round[pos] = self.round

    def _grow(self, ids: np.ndarray) -> np.ndarray:
        pos = self.index.add(ids)
        need = self.index.n
        if need > len(self.values):
            cap = max(2 * len(self.values), need, 1024)
            self.values = _grown(self.values, cap)
            self.synced = _grown(self.synced, cap)
            fresh = self.rule.init_slots((cap, self.dim))
            for new, old in zip(fresh, self.slots):
                new[:len(old)] = old
            self.slots = fresh
            self.counts = _grown(self.counts, cap, zero=True)
            self.synced_round = _grown(self.synced_round, cap, zero=True)
        return pos

    def read(self, ids: np.ndarray) -> np.ndarray:
        pos = self.index.lookup(ids)
        if (pos < 0).any():
            raise ConfigError(f"table {self.name}: rows read before they were pulled into the replica")
        return self.values[pos]

    def apply(self, ids: np.ndarray, grads: np.ndarray) -> None:
        """One local step of the rows of distinct ``ids`` (read by this step's forward)."""
        if not len(ids):
            return
        pos = self.index.lookup(ids)
        if (pos < 0).any():
            raise ConfigError(f"table {self.name}: gradients for {(pos < 0).sum()} ids this trainer never "
                              f"read (e.g. {ids[pos < 0][:3].tolist()}); pull rows before pushing their gradients")
        self.counts[pos] += 1
        param = self.values[pos]
        slots = [s[pos] for s in self.slots]
        self.rule.apply(param, grads, slots, self.counts[pos], 1.0)
        self.values[pos] = param
        for s, part in zip(self.slots, slots):
            s[pos] = part
        self.touched.append(pos)

    def round_delta(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """(positions, ids, what the servers apply as a gradient: (synced - local) / n, the
        squared norm of local - synced) of the rows touched this round."""
        pos = np.unique(np.concatenate(self.touched)) if self.touched else np.empty(0, np.int64)
        change = self.values[pos] - self.synced[pos]
        grads = -change / np.float32(n)      # -(a - b) is exact: the servers add change / n
        return pos, self.index.ids[pos], grads.astype(np.float32, copy=False), float(np.square(change,
                                                                                              dtype=np.float64).sum())

    def sent(self, pos: np.ndarray) -> np.ndarray:
        """The round of rows ``pos`` (round_delta's) went out: a new round starts, in which they
        stay fresh (their local values are newer than anything the servers hold until the merge
        lands). Returns their local values now, for ``merged``."""
        self.round += 1
        self.synced_round[pos] = self.round
        self.touched = []
        return self.values[pos]

    def merged(self, pos: np.ndarray, rows: np.ndarray, sent: np.ndarray, at_send: np.ndarray) -> MergeNorms:
        """The servers' values of the rows sent (``sent``: what went out for them, as round_delta
        made it; ``at_send``: their local values then, as ``sent()`` returned them): they become
        synced, and local plus what this trainer trained since the send. Returns the squared
        norms of the merged values and of what the others changed: merged - (synced + this
        trainer's own share), not merged - local, which would count the 1/n of this trainer's
        own change as if someone else had made it; both over every row sent and over the
        *settled* rows: those this trainer's own change in the round moved by less than their
        synced size. A young row (the servers created it a few steps ago, near zero) changes by
        about its own size in any round, so against it any k looks stale: measured (CTR demo,
        2 + 2, the first round) relative drift 0.40-0.42 over all rows, 0.05 over the settled
        ones; once rows have grown (k = 4: step 17 on) the two agree within 11%."""
        alone = self.synced[pos] - sent
        drift_rows = np.square(rows - alone, dtype=np.float64).sum(axis=1)
        value_rows = np.square(rows, dtype=np.float64).sum(axis=1)
        own_rows = np.square(at_send - self.synced[pos], dtype=np.float64).sum(axis=1)
        settled = own_rows < np.square(self.synced[pos], dtype=np.float64).sum(axis=1)
        norms = MergeNorms(float(value_rows.sum()), float(drift_rows.sum()),
                           float(value_rows[settled].sum()), float(drift_rows[settled].sum()))
        since = self.values[pos] - at_send
        # Nothing trained since the send (a blocking send, or rows this round left alone): the
        # merged values exactly, not merged + 0.0 (which turns -0.0 into 0.0).
        trained = since.any(axis=1)
        local = rows.copy()
        local[trained] += since[trained]
        self.values[pos] = local
        self.synced[pos] = rows
        return norms

    def restore(self, ids: np.ndarray, counts: np.ndarray, slots: list[np.ndarray]) -> None:
        """A fresh replica takes saved optimizer state of rows ``ids`` (geo/trainer_state.py); their
        values are pulled at their first read."""
        if self.rows:
            raise ConfigError(f"table {self.name}: optimizer state is restored into an empty replica only")
        if len(counts) != len(ids) or any(len(s) != len(ids) for s in slots) or len(slots) != len(self.slots):
            raise ConfigError(f"table {self.name}: saved optimizer state for {len(ids)} rows does not fit")
        pos = self._grow(ids)
        self.values[pos] = 0.0
        self.synced[pos] = 0.0
        self.synced_round[pos] = 0          # never fresh: round counts from 1
        self.counts[pos] = counts
        for mine, saved in zip(self.slots, slots):
            mine[pos] = saved

    def forget(self) -> None:
        """Every row is pulled again at its next read (a rollback, Trainer.pull); the optimizer
        state stays (docs/modes.md)."""
        self.round += 1
        self.touched = []


class DenseReplica:
    """The dense parameters (the Trainer's flat views: trained in place), what was last synced of
    them, and this trainer's optimizer slots."""

    def __init__(self, values, optimizer: OptimizerConfig):
        self.values, self.optimizer = values, optimizer
        self.rule = make_rule(optimizer)
        self.slots = {n: self.rule.init_slots(v.shape) for n, v in values.items()}
        self.steps = 0
        self.synced = {n: v.copy() for n, v in values.items()}

    def set_lr_scale(self, scale: float) -> None:
        self.rule = make_rule(scaled(self.optimizer, scale))

    def apply(self, grads) -> None:
        self.steps += 1
        for name, v in self.values.items():
            self.rule.apply(v, grads[name], self.slots[name], self.steps, 1.0)

    def round_delta(self, n: int) -> tuple[dict, float]:
        """(what the servers apply as gradients: (synced - local) / n, squared norm of local - synced)."""
        out, norm = {}, 0.0
        for name, v in self.values.items():
            change = v - self.synced[name]
            norm += float(np.square(change, dtype=np.float64).sum())
            out[name] = (-change / np.float32(n)).astype(np.float32, copy=False)
        return out, norm

    def local_copy(self) -> dict:
        return {n: v.copy() for n, v in self.values.items()}

    def merged(self, sent: dict, values: dict | None = None, at_send: dict | None = None) -> MergeNorms:
        """The servers' merged values came back (``sent``: what went out, as round_delta made
        it): ``values`` and this trainer's local values at the send (``at_send``, local_copy()
        then), or None: the push's reply wrote them into the parameters (nothing trained since).
        They are synced; local becomes merged + what was trained since the send. The squared
        norms of the merged values and of what the others changed: merged - (synced + this
        trainer's own share); the dense values all count as settled (they start at their
        initialiser's scale, not near zero)."""
        value, drift = 0.0, 0.0
        for name, v in self.values.items():
            merged = v if values is None else values[name]
            alone = self.synced[name] - sent[name]
            drift += float(np.square(merged - alone, dtype=np.float64).sum())
            if values is not None:
                assert at_send is not None, "merged values without the local values at the send"
                since = v - at_send[name]
                v[...] = merged + since if since.any() else merged
            self.synced[name][...] = merged
            value += float(np.square(merged, dtype=np.float64).sum())
        return MergeNorms(value, drift, value, drift)


def _grown(arr: np.ndarray, cap: int, zero: bool = False) -> np.ndarray:
    out = (np.zeros if zero else np.empty)((cap, *arr.shape[1:]), arr.dtype)
    out[:len(arr)] = arr
    return out
