"""One sparse table partition on one server: rows created on first pull,
updated row by row with per-row optimizer state.

Sync mode: step k's pushes from every live trainer are gathered, duplicate ids
merged and averaged over trainers, and applied once; pulls for step k+1 wait
for that. Async mode: each push is applied on arrival.

The table decides what happens to rows (steps, admission and eviction policies,
which pull a push belongs to); its RowStore (row_store.py) holds them. Nothing
here indexes a row array.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import time
from typing import Callable, Protocol, runtime_checkable

import numpy as np
import pandas as pd

from paramshard.errors import ConfigError
from paramshard.limits import Limits
from paramshard.mode import Mode
from paramshard.optim import OptimizerConfig, check_lr_scale, scaled
from paramshard.placement.rows import merge_duplicates
from paramshard.placement.sparse_hash import admitted_by_probability, initial_rows
from paramshard.tables import Admission, Eviction, check_table_settings
from paramshard.update_rules import make_rule
from paramshard.server.core.barrier import Membership, StepBarrier
from paramshard.server.storage.numpy_row_store import NumpyRowStore
from paramshard.server.storage.row_formats import check_row_format, rounded
from paramshard.server.storage.row_store import RowStore


DROP_SLICE = 1 << 15       # rows a drop slice reads: a few ms, between two requests


@runtime_checkable
class _HoldsArrays(Protocol):
    """A row store whose rows are arrays (the numpy and the compiled stores; not a RowStore's
    promise): what the ``values`` and ``slots`` of tests and benchmarks read."""
    values: np.ndarray
    slots: list[np.ndarray]


@dataclasses.dataclass
class _Drop:
    doomed: Callable[[np.ndarray], np.ndarray]      # ids -> mask of those to drop
    position: int                                   # rows below it hold none of them


class SparseTable:
    def __init__(self, name: str, dim: int, seed: int, optimizer: OptimizerConfig, admission: Admission,
                 eviction: Eviction, init_scale: float, mode: str, membership: Membership,
                 limits: Limits = Limits(), capacity: int = 1024, store: Callable[..., RowStore] = NumpyRowStore,
                 dtype: str = "float32", rounding: str = "nearest", memory_budget: int | None = None,
                 tier_dir=None, server_budget=None):
        """``store``: makes the RowStore (row_store.py) that holds the rows, called as
        ``store(dim, rule, keep_last_seen=, count_admissions=, max_rows=, capacity=, value_dtype=,
        rounding=, seed=)``. ``dtype``, ``rounding``: how rows are stored (row_formats.py). With a
        budget, also ``memory_budget=`` (bytes), ``tier_dir=`` and ``server_budget=`` (the compiled
        store's disk tier, tiered_row_store.py)."""
        check_table_settings(name, dim, seed, init_scale)
        check_row_format(name, dtype, rounding)
        limits.check("max_dim", dim, f"table {name!r}: dim")
        self.name, self.dim, self.seed, self.mode, self.limits = name, dim, seed, Mode.parse(mode), limits
        self.optimizer, self.admission, self.eviction, self.init_scale = optimizer, admission, eviction, init_scale
        self.dtype, self.rounding = dtype, rounding
        self.rule = make_rule(optimizer)
        self.lr_scale = 1.0     # the rule runs at optimizer.lr x lr_scale (Trainer.scale_learning_rate)
        self.membership = membership
        self.barrier = StepBarrier(membership, f"table {name!r}")
        tier = {k: v for k, v in (("memory_budget", memory_budget), ("tier_dir", tier_dir),
                                  ("server_budget", server_budget)) if v is not None}
        if tier and store is NumpyRowStore:
            raise ConfigError(f"table {name!r}: a memory budget needs the compiled row store (the numpy "
                              f"store keeps every row in RAM)")
        if tier:
            tier["table_name"] = name       # a full disk tier names its table (tier_space.py)
        self.store: RowStore = store(dim, self.rule, keep_last_seen=bool(eviction.unseen_steps),
                                     count_admissions=admission.min_count > 1,
                                     max_rows=limits.max_rows, capacity=capacity, value_dtype=dtype,
                                     rounding=rounding, seed=seed, **tier)
        if hasattr(self.store, "label"):
            self.store.label = f"table {name!r}"      # named in its address-space errors
        self.memory_budget = memory_budget
        self.version = 0                               # completed steps (sync) or pushes (async)
        self._pending: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}   # trainer -> (rows, grads, ids)
        # trainer -> (ids, rows); trainer ids are checked against the job, so this stays small.
        # A few per trainer: a trainer that prefetches pulls batch k+1 (in up to two pieces)
        # before and around its push of batch k.
        self._last_pull: dict[int, collections.deque] = collections.defaultdict(lambda: collections.deque(maxlen=4))
        self.evicted = 0
        self.timings: collections.defaultdict[str, float] = collections.defaultdict(float)   # seconds per phase (stats)
        self.rows_updated = 0
        # Told which rows changed (bounded-loss replication, server/elastic/replication.py): ``rows(handles)``,
        # ``grew(old_count, new_count)``, ``everything()``. None: nobody asks.
        self.changes = None
        # Told which ids changed and which were evicted, by id (delta publishing,
        # server/services/delta_service.py): ``changed(ids)``, ``evicted(ids)``. None: nobody asks.
        self.watch = None
        # Bounded-loss recovery: rows made after the last copy died with their server, so a push may
        # name an id its trainer pulled from the old one: make the row (its first pull's) and apply.
        self.create_on_push = False
        self._dropping: _Drop | None = None       # rows of partitions handed away, going a slice at a time

    # -- rows -------------------------------------------------------------
    @property
    def num_rows(self) -> int:
        return self.store.num_rows

    @property
    def nbytes(self) -> int:
        return self.store.nbytes

    def tier_stats(self) -> dict | None:
        """The disk tier's figures (tiered_row_store.py), None when the rows are all in RAM."""
        stats = getattr(self.store, "tier_stats", None)
        return stats() if stats is not None else None

    def close(self) -> None:
        """Give back what the store holds outside the process (a tier's files) now."""
        close = getattr(self.store, "close", None)
        if close is not None:
            close()

    def reserve(self, rows: int) -> None:
        """Room for ``rows`` rows now, so filling the table never copies it to grow."""
        self.store.reserve(rows)

    def _admit(self, ids: np.ndarray) -> np.ndarray:
        """Which of these new, distinct ids get a row now."""
        ok = admitted_by_probability(self.seed, ids, self.admission.probability)
        if self.admission.min_count == 1:
            return ok
        return ok & (self.store.count(ids) >= self.admission.min_count)

    def _create(self, ids: np.ndarray, values: np.ndarray, version: int, state=None) -> np.ndarray:
        """Rows for new distinct ``ids`` (first touch, import, restore: the one way rows are
        made), within PARAMSHARD_MAX_ROWS."""
        self.limits.check("max_rows", self.num_rows + len(ids), f"table {self.name!r}: rows on this server")
        return self.store.create(ids, values, version, state)

    def rows_for(self, ids: np.ndarray, create: bool) -> np.ndarray:
        """Row of each id (-1: not admitted). ``ids`` may repeat. New rows follow the order
        their ids first appear in ``ids``."""
        if create and self._admits_every_id and self.num_rows + len(ids) <= self.limits.max_rows:
            # A pull's first touch in one call (one pass in a compiled store); within the row
            # limit whatever it makes, so it never has to stop half way.
            return self.store.lookup_or_create(ids, self.version, self.seed, self.init_scale)
        rows = self.store.lookup(ids)
        missing = np.flatnonzero(rows < 0)
        if create and len(missing):
            inverse, new_ids = pd.factorize(ids[missing])     # distinct, in the order they first appear
            new_ids = np.asarray(new_ids, np.uint64)
            admitted = self._admit(new_ids)
            row_of_new = np.full(len(new_ids), -1, np.int64)
            if admitted.any():
                self.limits.check("max_rows", self.num_rows + int(admitted.sum()),
                                  f"table {self.name!r}: rows on this server")
                # The initial rows first: if making them fails, no row and no index entry exists.
                fresh = initial_rows(self.seed, new_ids[admitted], self.dim, self.init_scale)
                row_of_new[admitted] = self._create(new_ids[admitted], fresh, self.version)
            rows[missing] = row_of_new[inverse]
        return rows

    @property
    def _admits_every_id(self) -> bool:
        return self.admission.probability >= 1.0 and self.admission.min_count == 1

    def pull(self, ids: np.ndarray, trainer: int | None = None, create: bool = True) -> np.ndarray:
        """Rows of ``ids``. ``create=False`` (evaluation) stores nothing: an id
        without a row reads what its first training pull would give it."""
        started = time.perf_counter()
        before = self.num_rows
        rows = self.rows_for(ids, create=create)
        if self.num_rows != before:
            self._grew(before)
        looked_up = time.perf_counter()
        have = rows >= 0
        if have.all():
            out = self.store.gather(rows)
        else:
            out = np.zeros((len(ids), self.dim), np.float32)
            out[have] = self.store.gather(rows[have])
            if not create and self.admission.min_count == 1:
                absent = np.flatnonzero(~have)
                fresh = absent[admitted_by_probability(self.seed, ids[absent], self.admission.probability)]
                # As its first training pull would make it: rounded to the table's row format.
                out[fresh] = rounded(initial_rows(self.seed, ids[fresh], self.dim, self.init_scale), self.dtype)
        if self.eviction.unseen_steps:
            self.store.touch(rows[have], self.version)
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
            return self.store.lookup(ids)
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
            both = pd.Index(np.concatenate([ids_i, ids_j]))      # a hash of this batch only
            if not both.is_unique:       # not two pieces of one batch (e.g. a pull resent after a move)
                continue
            where = both.get_indexer(ids)
            if (where >= 0).all():
                rows = np.concatenate([rows_i, rows_j])[where]
                del recent[j], recent[i]
                return rows
        return self.store.lookup(ids)

    # -- updates ----------------------------------------------------------
    def push(self, trainer: int, step: int, ids: np.ndarray, grads: np.ndarray, distinct: bool = False) -> None:
        """Row gradients. paramshard's trainers merge duplicate ids before pushing
        and say so (``distinct``), which spares the server a sort."""
        if grads.shape != (len(ids), self.dim):
            raise ConfigError(f"table {self.name}: gradients are {list(grads.shape)}, expected "
                              f"[{len(ids)}, {self.dim}] for {len(ids)} ids")
        self.membership.check_trainer(trainer)
        self.membership.check_not_left(trainer, "push again")
        if self.mode.waits_every_step:
            self.barrier.check_arrival(trainer, step, self.version)
        started = time.perf_counter()
        if not distinct:
            ids, grads = merge_duplicates(ids, grads)
        elif len(ids) > 1 and pd.Index(ids).has_duplicates:   # a hash table: ~1 ms for 100k ids, a sort ~15
            raise ConfigError(f"table {self.name}: push_sparse says its ids are distinct but some repeat; "
                              f"merge duplicate ids (or send distinct=false and the server merges them)")
        rows = self._rows_of_push(trainer, ids)
        if self.create_on_push and (rows < 0).any():
            before = self.num_rows
            rows = self.rows_for(ids, create=True)
            if self.num_rows != before:
                self._grew(before)
        self._check_known(ids, rows)
        self.timings["push_lookup"] += time.perf_counter() - started
        if not self.mode.waits_every_step:      # async: applied on arrival
            self._apply(rows, grads, contributors=1)
            if self.watch is not None:
                self.watch.changed(ids[rows >= 0])
            self.version += 1
            self._maybe_evict()
            return
        self._pending[trainer] = (rows, grads.copy(), ids.copy())     # ids: to find the rows again after a drop
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
        if self.admission.min_count > 1 and len(unknown):
            unknown = unknown[~self.store.counted(unknown)]
        if len(unknown):
            raise ConfigError(f"table {self.name}: gradients for {len(unknown)} ids that were never pulled "
                              f"(e.g. {unknown[:3].tolist()}); pull rows before pushing their gradients")

    def maybe_finish_step(self) -> None:
        if not self.barrier.complete():
            return
        parts = [(rows, grads) for rows, grads, _ in self._pending.values()]
        if len(parts) == 1:
            rows, grads = parts[0]
        else:   # several trainers touched the same rows: sum them (then the rule averages)
            rows, grads = merge_duplicates(np.concatenate([p[0] for p in parts]),
                                           np.concatenate([p[1] for p in parts]))
        self._apply(rows, grads, contributors=len(parts))
        if self.watch is not None:
            self.watch.changed(np.concatenate([i[r >= 0] for r, _, i in self._pending.values()]))
        self._pending.clear()
        self.barrier.reset()
        self.version += 1
        self._maybe_evict()

    def _grew(self, before: int) -> None:
        """Rows before..num_rows-1 were made (a first touch): their values exist now."""
        if self.changes is not None:
            self.changes.grew(before, self.num_rows)
        if self.watch is not None:
            self.watch.changed(self.store.ids(before, self.num_rows - before))

    def waiting_for(self) -> list[int]:
        return self.barrier.waiting_for()

    def _apply(self, rows: np.ndarray, grads: np.ndarray, contributors: int) -> None:
        keep = rows >= 0                     # ids never admitted: their gradient is dropped
        if not keep.all():
            rows, grads = rows[keep], grads[keep]
        if not len(rows):
            return
        started = time.perf_counter()
        self.store.update(rows, grads, scale=1.0 / contributors, version=self.version)
        if self.changes is not None:
            self.changes.rows(rows)
        self.timings["push_optimizer"] += time.perf_counter() - started
        self.rows_updated += len(rows)

    def set_lr_scale(self, scale: float) -> None:
        """Update rows at the registered rate x ``scale`` from the next update on."""
        rule = make_rule(scaled(self.optimizer, check_lr_scale(scale, f"table {self.name!r}")))
        self.store.set_rule(rule)
        self.rule, self.lr_scale = rule, float(scale)

    # -- eviction and export ----------------------------------------------
    def _maybe_evict(self) -> None:
        n = self.eviction.unseen_steps
        if not n or self.version % max(1, n // 2):
            return
        # An eviction reads and compacts every row anyway: a drop under way is finished with it
        # (a slice's scan position would not survive the compaction).
        self.settle_drops()
        held = self.store.ids() if self.watch is not None else None     # to name the evicted ids
        evicted = self.store.evict_unseen(self.version - n)
        if evicted:
            self.evicted += evicted
            if held is not None:
                self.watch.evicted(held[self.store.lookup(held) < 0])
            if self.changes is not None:
                self.changes.everything()          # row handles moved: the next copy is whole
            self._last_pull.clear()                 # row numbers changed

    def ids_by_row(self) -> np.ndarray:
        self.settle_drops()
        return self.store.ids()

    def export(self) -> tuple[np.ndarray, np.ndarray]:
        self.settle_drops()
        ids = self.store.ids()
        return ids, self.store.gather(np.arange(len(ids)))

    def load(self, ids: np.ndarray, values: np.ndarray) -> None:
        """Set rows from an exported table (creating them, admission bypassed)."""
        if values.shape != (len(ids), self.dim):
            raise ConfigError(f"table {self.name}: import of {list(values.shape)} rows, dim is {self.dim}")
        if len(np.unique(ids)) != len(ids):
            raise ConfigError(f"table {self.name}: an import names some ids twice; each id may appear once")
        rows = self.store.lookup(ids)
        new = rows < 0
        if new.any():
            rows[new] = self._create(ids[new], values[new], self.version)
            self.store.touch(rows, self.version)
        self.store.set_values(rows, values)
        if self.changes is not None:
            self.changes.everything()              # an import: rare, copied whole
        if self.watch is not None:
            self.watch.changed(ids)

    # -- checkpoints (checkpoint_service.py) ------------------------------
    def snapshot_page(self, start: int, count: int) -> dict[str, np.ndarray]:
        """Rows start..start+count-1 and their state by part name; the first page also
        carries the admission counters (``counted_ids``, ``counts``)."""
        self.settle_drops()
        page = self.store.page(start, count)
        counters = self.store.counters() if start == 0 else None
        if counters is not None:
            page["counted_ids"], page["counts"] = counters
        return page

    def restore_rows(self, ids: np.ndarray, values: np.ndarray, state: dict, version: int, evicted: int,
                     reserve: int = 0, counters: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """Rows of a checkpoint page (new distinct ids, checked by the caller); ``reserve``:
        room for the rows of every page (the first page's hint), checked before anything."""
        self.settle_drops()
        self.limits.check("max_rows", self.num_rows + len(ids), f"table {self.name!r}: rows on this server")
        if reserve < 0:
            raise ConfigError(f"restore_sparse: table {self.name!r}: reserve must be >= 0 rows, got {reserve}")
        self.limits.check("max_rows", reserve, f"restore_sparse: table {self.name!r}: rows reserved on this server")
        self.store.reserve(max(self.num_rows + len(ids), reserve))
        self._create(ids, values, version, state)
        if self.watch is not None:
            self.watch.changed(ids)
        self._last_pull.clear()
        if counters is not None:
            self.store.restore_counts(*counters)
        self.version = max(self.version, version)
        self.evicted = max(self.evicted, evicted)

    # -- partitions: a move between servers (migration_service.py, partition_intake.py) -------------
    # The services that move rows go through these; none of them touches the store.
    def page_layout(self) -> dict[str, np.ndarray]:
        """An empty page: the names, dtypes and row shapes of this table's pages."""
        return self.store.page(0, 0)

    def page(self, start: int, count: int, keep: Callable[[np.ndarray], np.ndarray] | None = None) -> dict:
        """Rows start..start+count-1 by part name (RowStore.page), only those whose ids ``keep``
        says (a mask of the page's ids) when given."""
        self.settle_drops()
        page = self.store.page(start, count)
        if keep is not None:
            mine = keep(page["ids"])
            page = {k: v[mine] for k, v in page.items()}
        return page

    def rows_of(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """The rows of those ``ids`` that have one, whole (ids, values, state), as a page."""
        rows = self.store.lookup(ids)
        have = rows >= 0
        rows = rows[have]
        return {"ids": ids[have], "values": self.store.gather(rows), **self.store.state_of(rows)}

    def counters_of(self, keep: Callable[[np.ndarray], np.ndarray]) -> dict[str, np.ndarray]:
        """The admission counters of the ids ``keep`` says, as a page's ``counted_ids``/``counts``."""
        counters = self.store.counters()
        if counters is None:
            return {}
        ids, counts = counters
        mine = keep(ids)
        return {"counted_ids": ids[mine], "counts": counts[mine].astype(np.int64)}

    def counters(self) -> tuple[np.ndarray, np.ndarray] | None:
        return self.store.counters()

    def take_rows(self, rows: dict[str, np.ndarray]) -> None:
        """Rows of a partition on its way here (a move's copied page: ids, values, state) made
        rows now, an id that has one already overwritten in place. They are not served before
        the hand-off (their partitions are held or refused before a request reaches the table),
        so the hand-off has only the rows written since the copy left to take (``adopt_rows``)."""
        ids = rows["ids"]
        if len(pd.unique(ids)) != len(ids):
            raise ConfigError(f"table {self.name!r}: a moved page names some ids twice")
        self.settle_drops()
        if self.watch is not None:      # published once their partitions are served here (delta_service.py)
            self.watch.changed(ids)
        handles = self.store.lookup(ids)
        have = handles >= 0
        state = {n: a for n, a in rows.items() if n not in ("ids", "values")}
        if have.any():
            # In place, so no row moves: a whole-table copy (replication) goes on by page.
            self.store.set_values(handles[have], rows["values"][have])
            self.store.set_state(handles[have], self.version, {n: a[have] for n, a in state.items()})
            if self.changes is not None:
                self.changes.rows(handles[have])
        if not have.all():
            # No reserve(): it rebuilds the index at once past its load, a stall of seconds on a
            # server of millions of rows that also serves; create() grows it a slice at a time.
            new = ~have
            before = self.num_rows
            self._create(ids[new], rows["values"][new], self.version, {n: a[new] for n, a in state.items()})
            if self.changes is not None:        # bounded-loss: the replica takes these rows too
                self.changes.grew(before, self.num_rows)

    def adopt_rows(self, rows: dict[str, np.ndarray], version: int, counters=None) -> None:
        """The hand-off: rows written since the copy (or every row of the partitions, after an
        eviction) made rows here as ``take_rows`` does, with the admission counters ``(ids,
        counts)``. The table starts at ``version`` if it is behind."""
        self.version = max(self.version, version)
        self.take_rows(rows)
        if counters is not None and len(counters[0]):
            self.store.restore_counts(counters[0], counters[1].astype(np.uint32))

    def drop_now(self, doomed: Callable[[np.ndarray], np.ndarray]) -> int:
        """Drop the rows whose ids ``doomed`` says, at once (rare: a move's rows that an eviction
        on their old owner made stale); how many went."""
        self.drop_later(doomed)
        return self.settle_drops()

    def drop_later(self, doomed: Callable[[np.ndarray], np.ndarray]) -> None:
        """Drop the rows whose ids ``doomed`` says (a mask), a slice at a time (``drop_some``),
        so that no request waits on the whole drop. Until they are gone they are never served
        (their partitions are refused before a request reaches the table) and any reader of
        the whole table (``page``, ``export``, ``ids_by_row``, checkpoints) drops them first."""
        if self._dropping is not None:
            earlier = self._dropping.doomed
            doomed = (lambda d, e: lambda ids: d(ids) | e(ids))(doomed, earlier)
        self._dropping = _Drop(doomed, 0)

    @property
    def dropping(self) -> bool:
        return self._dropping is not None

    def drop_some(self, rows: int = DROP_SLICE) -> int:
        """One slice of a drop: rows ``rows`` at most are read, and of those the doomed go (their
        places filled by the last rows, RowStore.drop). How many rows went."""
        d = self._dropping
        if d is None:
            return 0
        if getattr(self.store, "drop_compacts", False):
            # A disk-tiered store drops by compacting every row (TieredRowStore.drop, a piece at
            # a time): one compaction for the whole drop, not one per slice.
            return self.settle_drops()
        if d.position >= self.num_rows:
            self._dropping = None
            return 0
        ids = self.store.ids(d.position, rows)
        doomed = ids[d.doomed(ids)]
        if not len(doomed):
            d.position += len(ids)         # this slice is clean; otherwise look again: rows moved into it
            return 0
        dropped = self.store.drop(doomed)
        self._rows_moved()
        return dropped

    def settle_drops(self) -> int:
        """Finish the drop under way now (a whole-table reader); how many rows went."""
        if self._dropping is None:
            return 0
        d, self._dropping = self._dropping, None
        ids = self.store.ids()
        doomed = ids[d.doomed(ids)]
        if not len(doomed):
            return 0
        dropped = self.store.drop(doomed)
        self._rows_moved()
        return dropped

    def _rows_moved(self) -> None:
        """Row handles changed (a drop moved rows into the gaps): a sync step's pushes waiting for
        the other trainers find their rows again by id (none of them was dropped: a partition
        handed away is refused before its pushes reach the table)."""
        for trainer, (rows, grads, ids) in self._pending.items():
            again = self.store.lookup(ids)
            again[rows < 0] = -1            # not admitted when pushed: its gradient stays dropped
            self._pending[trainer] = (again, grads, ids)
        self._last_pull.clear()
        if self.changes is not None:
            self.changes.everything()

    # -- the reference store's arrays, for tests and benchmarks that look inside --
    @property
    def index(self):
        return self.store.index

    def _arrays(self) -> _HoldsArrays:
        if not isinstance(self.store, _HoldsArrays):
            raise AttributeError(f"table {self.name!r}: its row store ({type(self.store).__name__}) keeps "
                                 f"no value and state arrays to look inside")
        return self.store

    @property
    def values(self) -> np.ndarray:
        return self._arrays().values

    @property
    def slots(self) -> list[np.ndarray]:
        return self._arrays().slots

    @property
    def steps(self):
        return self.store.steps
