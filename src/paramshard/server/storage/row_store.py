"""The storage contract of one sparse table partition: what a row store must do.

A ``SparseTable`` (sparse_table.py) decides *what* happens to rows (sync steps,
admission and eviction policies, which pull a push belongs to); a ``RowStore``
holds them: the id -> row index, the row values, the update rule's per-row
state, per-row update counts and last-seen steps, and the admission counters.
Services never touch a store's arrays: the sparse and checkpoint services go
through the table, the table through this contract.

Everything is batched: ids come in as a uint64 array, rows are int64 handles
(-1: no row), values come out as float32 [n, dim] arrays; no call is per row.
A handle stays valid until the next ``evict_unseen`` or ``clear``. There is
exactly one way to create rows, ``create``: first touch, import and checkpoint
restore all use it, with their own initial values and state. ``lookup_or_create``
is a pull's first touch as one call, which a compiled store does in one pass;
it must make the same rows, in the same order, as ``lookup`` followed by
``create`` of the missing ids in the order they first appear
(``lookup_or_create_in_parts`` below, which the numpy store uses).

``numpy_row_store.NumpyRowStore`` is the reference implementation (vectorised
numpy). A compiled or tiered store (issue 22) implements the same contract and
must give bit-identical tables for the same calls.

State travels as named arrays, the names of a checkpoint page
(checkpoint_service.py): ``slot0``.. (the rule's state, float32 [n, width] with the
widths of ``rule.slot_widths(dim)``: dim, or 1 for a per-row accumulator),
``steps`` (update counts, for rules that read them) and ``last_seen`` (the table
version that last touched a row, kept when eviction is on).

Row format (row_formats.py): a store is made as ``store(dim, rule, keep_last_seen=,
count_admissions=, max_rows=, capacity=, value_dtype=, rounding=, seed=)``. Rows are
*stored* as ``value_dtype``: "float32" (the default), "float16" or "bfloat16" (2 bytes
a value). Values still come in and go out as float32, always: ``gather`` and ``page``
give each stored value exactly, as a float32; ``create`` and ``set_values`` round the
given float32 values to the format (to nearest, ties to even). ``update`` loads each
row as float32, applies the rule exactly as for float32 rows, and rounds the new
values: to nearest, or with ``rounding="stochastic"`` at random, from bits that are a
pure function of (``seed``, the row's id, the ``version`` passed to ``update``, the
column): the same calls give the same rows on every store and in every run. The rule's
state, update counts and last-seen versions are not affected: they stay float32/uint32.
"""
from __future__ import annotations

from typing import Mapping, Protocol

import numpy as np
import pandas as pd

from paramshard.placement.sparse_hash import initial_rows


class RowStore(Protocol):
    dim: int
    slot_count: int          # state arrays of the update rule, per row
    value_dtype: str         # how rows are stored: "float32", "float16" or "bfloat16"
    rounding: str            # how updated half rows are rounded: "nearest" or "stochastic"

    @property
    def num_rows(self) -> int:
        """Rows held."""

    @property
    def nbytes(self) -> int:
        """Bytes held: rows, state, index and admission counters (the ``stats`` figure)."""

    @property
    def keeps_steps(self) -> bool:
        """Per-row update counts are kept (the rule reads them)."""

    @property
    def keeps_last_seen(self) -> bool:
        """Per-row last-seen versions are kept (eviction is on)."""

    def reserve(self, rows: int) -> None:
        """Room for ``rows`` rows now, so filling never copies or rehashes; nothing created."""

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Row handle of each id (ids may repeat), -1 where the id has no row."""

    def create(self, ids: np.ndarray, values: np.ndarray, version: int,
               state: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        """The one row-creation path. ``ids``: distinct, none with a row yet; ``values``: their
        float32 [n, dim] rows. ``state`` (by part name) sets the rule's state, update counts and
        last-seen versions; what it leaves out starts fresh (the rule's initial state, 0 updates,
        last seen at ``version``). All or nothing: a failure leaves the store as it was.
        Returns the new rows' handles, in the order of ``ids``."""

    def lookup_or_create(self, ids: np.ndarray, version: int, seed: int, init_scale: float) -> np.ndarray:
        """Row of each id (ids may repeat); an id without one gets a new row holding its
        initial values (placement.sparse_hash.initial_rows(seed, id, dim, init_scale)), fresh
        state and last seen at ``version``. New rows follow the order ids first appear."""

    def gather(self, rows: np.ndarray) -> np.ndarray:
        """The values of rows ``rows`` (all >= 0), float32 [len(rows), dim], a new array (half
        rows: each stored value exactly)."""

    def set_values(self, rows: np.ndarray, values: np.ndarray) -> None:
        """Overwrite the values of rows ``rows`` (an import; half rows: rounded to nearest);
        their state is kept."""

    def update(self, rows: np.ndarray, grads: np.ndarray, scale: float, version: int = 0) -> None:
        """Apply the update rule to distinct rows ``rows`` (all >= 0) with gradients
        ``scale * grads``, counting one update of each. ``version``: the table version this
        update completes (SparseTable.version before it); only stochastic rounding reads it,
        so no row is ever rounded with the same random bits twice."""

    def set_state(self, rows: np.ndarray, version: int, state: Mapping[str, np.ndarray]) -> None:
        """Overwrite the state of distinct existing rows ``rows`` as ``create`` sets a new row's:
        ``state``'s parts where given, else fresh (initial state, 0 updates, last seen at
        ``version``). With ``set_values``, a row made again in place: its handle stays."""

    def set_rule(self, rule) -> None:
        """Update rows with ``rule`` from now on: the same kind of rule (same state arrays) at
        another learning rate (Trainer.scale_learning_rate)."""

    def touch(self, rows: np.ndarray, version: int) -> None:
        """Rows ``rows`` (all >= 0) were pulled at table version ``version`` (eviction's clock)."""

    def count(self, ids: np.ndarray) -> np.ndarray:
        """Admission counters: count one sighting of each of the distinct ``ids``; their counts now."""

    def counted(self, ids: np.ndarray) -> np.ndarray:
        """Whether each id has an admission counter (bool)."""

    def restore_counts(self, ids: np.ndarray, counts: np.ndarray) -> None:
        """Set the admission counters of ``ids`` (a checkpoint's)."""

    def evict_unseen(self, before: int) -> int:
        """Drop the rows last seen before version ``before``; how many. Handles change."""

    def drop(self, ids: np.ndarray) -> int:
        """Drop the rows of ``ids`` (ids without a row are skipped): their partition moved to
        another server (server/elastic/migration_service.py); how many went. The work is per id dropped,
        not per row held: the last rows that stay fill the places of the rows that go
        (``swap_plan``), so only their handles change; the others keep theirs."""

    def state_of(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The state of rows ``rows`` (handles, any order) by part name, as ``page`` gives it."""

    def ids(self, start: int = 0, count: int | None = None) -> np.ndarray:
        """The ids of rows start..start+count-1 (every row: the default), in row order (a copy)."""

    def page(self, start: int, count: int) -> dict[str, np.ndarray]:
        """Rows start..start+count-1 as named arrays: ``ids``, ``values``, then the state parts
        kept (``slot0``.., ``steps``, ``last_seen``); copies."""

    def counters(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(ids, counts) of the admission counters, None when the table counts nothing."""

    def clear(self) -> None:
        """Drop every row and counter (capacity may be kept)."""


def lookup_or_create_in_parts(store: RowStore, ids: np.ndarray, version: int, seed: int,
                              init_scale: float) -> np.ndarray:
    """``lookup_or_create`` as ``lookup`` then ``create``: the contract's definition of it."""
    rows = store.lookup(ids)
    missing = np.flatnonzero(rows < 0)
    if len(missing):
        codes, new_ids = pd.factorize(ids[missing])        # distinct, in the order they first appear
        new_ids = np.asarray(new_ids, np.uint64)
        made = store.create(new_ids, initial_rows(seed, new_ids, store.dim, init_scale), version)
        rows[missing] = made[codes]
    return rows


def swap_plan(dropped: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray, int]:
    """How ``drop`` closes the gaps of rows ``dropped`` (distinct handles) in a store of ``rows``
    rows: (holes, movers, rows left). The rows that stay past the new end (movers, ascending)
    move to the dropped places below it (holes, ascending), pairwise; every store does the same,
    so their handles stay the same."""
    dropped = distinct_sorted(dropped)
    left = rows - len(dropped)
    holes = dropped[dropped < left]
    tail = np.ones(rows - left, bool)
    tail[dropped[dropped >= left] - left] = False
    movers = np.flatnonzero(tail).astype(np.int64) + left
    return holes, movers, left


def distinct_sorted(handles: np.ndarray) -> np.ndarray:
    """The distinct values of ``handles``, ascending (a sort: np.unique's hash is slower on these)."""
    out = np.sort(np.asarray(handles, np.int64))
    if len(out) > 1:
        out = out[np.concatenate(([True], out[1:] != out[:-1]))]
    return out
