"""Columns a reader carries beside the features, never fed to the model (issue 32).

- ``weight``: a numeric column whose value multiplies the row's loss and counts the row that
  many times in the metrics (data/metrics.py); missing, not a number, negative or infinite is
  a bad line, named like any other.
- ``group``: any column whose value names the row's group for GAUC (e.g. ``user_id``); its
  text is hashed to an int64 key (data/features/hashing.py), a missing value is a group of its
  own. The column may also be a feature.

Batches carry them as ``TabularBatch.extras`` ({"weight": float64 [B], "group": int64 [B]}).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SideColumns:
    weight: str | None = None
    group: str | None = None

    @property
    def names(self) -> list[str]:
        return [n for n in (self.weight, self.group) if n]

    def __bool__(self) -> bool:
        return bool(self.names)

    def encode(self, columns: dict, missing: frozenset, flag) -> dict:
        """{"weight": ..., "group": ...} for every row of ``columns``; ``flag(mask, reason_of)``
        marks bad rows (the Encoder's)."""
        from paramshard.data.errors import show
        from paramshard.data.features.encode import as_text, missing_mask, parse_numbers
        from paramshard.data.features.hashing import MISSING_TOKEN, feature_ids
        out = {}
        if self.weight:
            raw, name = columns[self.weight], self.weight
            miss = missing_mask(raw, missing)
            x, not_number = parse_numbers(raw, miss)
            flag(miss, lambda i: f"weight column {name!r} is missing")
            flag(not_number | (~miss & ~(np.isfinite(x) & (x >= 0))),
                 lambda i: f"weight column {name!r} must be a number >= 0, got {show(str(raw[i]).encode())}")
            out["weight"] = np.where(np.isfinite(x) & (x >= 0), x, 0.0).astype(np.float64)
        if self.group:
            raw = columns[self.group]
            text = np.where(missing_mask(raw, missing), MISSING_TOKEN, as_text(raw))
            out["group"] = feature_ids(self.group, text)
        return out
