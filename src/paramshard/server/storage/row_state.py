"""What every RowStore keeps beside a row's values, and how both stores read and write it.

The update rule's state (``slots``: float32 [rows, width] each), per-row update counts
(``steps``, uint32, for rules that read them) and last-seen table versions (``last_seen``,
uint32, when eviction is on), in row order. NumpyRowStore and CompiledRowStore hold them in
arrays of their own (grown copies or reserved address space); how a new row's state is set
and how a page of it reads is the same for both, so it is written here once.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np


class RowStateArrays:
    slots: list[np.ndarray]
    steps: np.ndarray | None
    last_seen: np.ndarray | None
    _slot_initials: list[np.ndarray]      # the rule's state of a new row, [1, width] each
    _rows: int

    @property
    def num_rows(self) -> int:
        return self._rows

    @property
    def keeps_steps(self) -> bool:
        return self.steps is not None

    @property
    def keeps_last_seen(self) -> bool:
        return self.last_seen is not None

    def _write_state(self, new: slice | np.ndarray, version: int, state: Mapping[str, np.ndarray]) -> None:
        """The state of rows ``new`` (being created): ``state``'s parts where given (a checkpoint
        page's), else fresh (the rule's initial state, 0 updates, last seen at ``version``)."""
        for i, (slot, initial) in enumerate(zip(self.slots, self._slot_initials)):
            given = state.get(f"slot{i}")
            slot[new] = initial if given is None else given
        if self.steps is not None:
            given = state.get("steps")
            self.steps[new] = 0 if given is None else given.astype(np.uint32)
        if self.last_seen is not None:
            given = state.get("last_seen")
            self.last_seen[new] = version if given is None else given.astype(np.uint32)

    def set_state(self, rows: np.ndarray, version: int, state: Mapping[str, np.ndarray]) -> None:
        """Overwrite the state of existing rows ``rows`` (handles, distinct) as ``create`` sets a
        new row's: ``state``'s parts where given, else fresh (a moved partition's rows arriving
        again: server/elastic/partition_intake.py)."""
        self._write_state(np.asarray(rows, np.int64), version, state)

    def _state_page(self, rows: slice | np.ndarray) -> dict[str, np.ndarray]:
        """Rows ``rows``' state by part name (``slot0``.., ``steps``, ``last_seen``), copies."""
        out = {f"slot{i}": s[rows].copy() for i, s in enumerate(self.slots)}
        if self.steps is not None:
            out["steps"] = self.steps[rows].astype(np.int64)
        if self.last_seen is not None:
            out["last_seen"] = self.last_seen[rows].astype(np.int64)
        return out

    def state_of(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The state of rows ``rows`` (handles, any order) by part name, as a page gives it (a
        partition's rows as they move to another server: server/elastic/migration_service.py)."""
        return self._state_page(np.asarray(rows, np.int64))
