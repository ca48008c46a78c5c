"""One copy of a sparse table's rows for serving, held in the servers' own row stores.

The rows live in a RowStore made by server/storage/row_stores.py (``numpy``, ``compiled``, or the
compiled store's tiered form with a memory budget and a disk tier: the same stores, the same row
formats, as a server's), so a table too big for RAM is served as it is trained. A lookup answers
as serving.LocalTable.lookup does: a held id reads its row (float32), an id without one its
deterministic initial row rounded to the table's row format (admission by probability as the
servers apply it) or zeros (a table with min_count > 1, or ``unknown="zeros"``).

A copy is changed only while no lookup reads it (versions.py keeps two and switches between
them), so the store needs no locking against writes. Lookups of one copy are serialised by its
own lock: the tiered store's reads stamp and spill regions (they write), and the lock costs a
lookup of 100 ids a few microseconds.
"""
from __future__ import annotations

import dataclasses
import threading

import numpy as np

from paramshard.errors import ConfigError
from paramshard.optim import SGD
from paramshard.inference.serving import fill_unknown
from paramshard.server.storage.row_stores import store_named, takes_budgets
from paramshard.update_rules import make_rule

UNKNOWN = ("initial", "zeros")
APPLY_PIECE = 8192        # rows changed per store call (upsert)


@dataclasses.dataclass(frozen=True)
class TableSettings:
    """What a table's unknown ids read and how its rows are stored (a model file's sparse entry)."""
    name: str
    dim: int
    seed: int
    init_scale: float
    min_count: int = 1
    probability: float = 1.0
    dtype: str = "float32"

    @classmethod
    def of(cls, local) -> "TableSettings":
        """From a serving.LocalTable (read_model's)."""
        return cls(local.name, local.dim, local.seed, local.init_scale, local.min_count, local.probability,
                   local.dtype)


@dataclasses.dataclass(frozen=True)
class StoreChoice:
    """Which row store holds served rows (`paramshard serve --row-store/--memory-budget/--tier-dir`)."""
    kind: str = "compiled"                # "compiled" or "numpy" (row_stores.STORES)
    memory_budget: int | None = None      # bytes per table copy; the compiled store's tiered form
    tier_dir: str | None = None           # where the tiered store's files go (None: a temporary dir)
    max_rows: int = 1 << 30

    def __post_init__(self):
        factory = store_named(self.kind)
        if self.memory_budget is not None and not takes_budgets(factory):
            raise ConfigError(f"--row-store {self.kind} keeps every row in RAM: a --memory-budget needs "
                              f"--row-store compiled (the store with the disk tier)")


class TableCopy:
    def __init__(self, settings: TableSettings, choice: StoreChoice, copy: str = "a"):
        self.settings = settings
        factory = store_named(choice.kind)
        tier = {}
        if choice.memory_budget is not None:
            # Each copy has its own files: the two copies are written at different times.
            tier = {"memory_budget": choice.memory_budget, "table_name": settings.name,
                    "tier_dir": None if choice.tier_dir is None else f"{choice.tier_dir}/{settings.name}-{copy}"}
        # The rule never runs (served rows are only set): plain SGD keeps no per-row state.
        self.store = factory(settings.dim, make_rule(SGD(lr=1.0)), keep_last_seen=False, count_admissions=False,
                             max_rows=choice.max_rows, capacity=1024, value_dtype=settings.dtype,
                             rounding="nearest", seed=settings.seed, **tier)
        if hasattr(self.store, "label"):
            self.store.label = f"served table {settings.name!r} (copy {copy})"
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        return self.settings.dim

    @property
    def num_rows(self) -> int:
        return self.store.num_rows

    def lookup(self, ids: np.ndarray, unknown: str = "initial") -> np.ndarray:
        """Rows of uint64 ``ids`` [n] -> float32 [n, dim], as serving.LocalTable.lookup."""
        s = self.settings
        ids = np.ascontiguousarray(ids, np.uint64)
        with self._lock:
            handles = self.store.lookup(ids)
            found = handles >= 0
            if found.all():          # the usual case: the rows gathered straight into the reply's array
                out = self.store.gather(handles)
            else:
                out = np.zeros((len(ids), s.dim), np.float32)
                if found.any():
                    out[found] = self.store.gather(handles[found])
        if unknown == "initial":
            fill_unknown(out, ids, found, s)
        return out

    def row_source(self, unknown: str):
        """A SparseEmbedding.attach row source (ids, training) -> rows."""
        return lambda ids, training: self.lookup(ids, unknown)

    # -- changes: only while no lookup reads this copy (versions.py) ------------------------------
    def upsert(self, ids: np.ndarray, values: np.ndarray) -> None:
        """Set the rows of distinct ``ids`` to ``values`` (float32 or float16 [n, dim]); rows are
        stored in the table's format (a float16 value in a float16 table: exactly)."""
        if not len(ids):
            return
        ids = np.ascontiguousarray(ids, np.uint64)
        # In pieces: lookups of the live copy run in other threads of this process. The store's
        # kernels release the GIL (server/storage/kernels); a piece bounds what holds it between
        # them (numpy indexing, the store's Python) and the temporaries of one call.
        for start in range(0, len(ids), APPLY_PIECE):
            self._upsert(ids[start:start + APPLY_PIECE], values[start:start + APPLY_PIECE])

    def _upsert(self, ids: np.ndarray, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values, np.float32)
        handles = self.store.lookup(ids)
        held = handles >= 0
        if held.any():
            self.store.set_values(handles[held], values[held])
        if not held.all():
            new = ~held
            self.store.create(ids[new], values[new], 0)

    def remove(self, ids: np.ndarray) -> int:
        if not len(ids):
            return 0
        ids = np.ascontiguousarray(ids, np.uint64)
        return sum(self.store.drop(ids[s:s + APPLY_PIECE]) for s in range(0, len(ids), APPLY_PIECE))

    def clear(self) -> None:
        self.store.clear()

    def close(self) -> None:
        close = getattr(self.store, "close", None)
        if close is not None:
            close()
