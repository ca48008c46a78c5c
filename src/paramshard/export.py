"""Sparse tables as one file: what every server held, merged, for inference or a new job.

The file is a plain .npz (ids uint64 sorted, values float32 [rows, dim], and
the table's settings as JSON), readable with numpy alone.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from .errors import ConfigError
from .sparse_hash import initial_rows


@dataclasses.dataclass
class ExportedTable:
    name: str
    ids: np.ndarray
    values: np.ndarray
    seed: int
    init_scale: float

    @property
    def dim(self) -> int:
        return self.values.shape[1]

    def lookup(self, ids, unknown: str = "initial") -> np.ndarray:
        """Rows for ``ids``; an id the table never stored gets its deterministic
        initial row (what training would have used) or zeros (``unknown="zeros"``)."""
        ids = np.asarray(ids, np.uint64)
        pos = np.searchsorted(self.ids, ids)
        pos_clipped = np.minimum(pos, max(len(self.ids) - 1, 0))
        found = (pos < len(self.ids)) & (self.ids[pos_clipped] == ids) if len(self.ids) else np.zeros(len(ids), bool)
        out = (initial_rows(self.seed, ids, self.dim, self.init_scale) if unknown == "initial"
               else np.zeros((len(ids), self.dim), np.float32))
        out[found] = self.values[pos_clipped[found]]
        return out


def save_table(path, meta: dict, ids: np.ndarray, values: np.ndarray) -> None:
    """``meta``: name, dim, seed, init_scale, optimizer (as export_sparse returns them)."""
    meta = {**meta, "format": 1}
    with open(Path(path), "wb") as f:   # a file object keeps numpy from appending ".npz"
        np.savez(f, ids=ids, values=values, meta=np.array(json.dumps(meta)))


def load_table(path) -> ExportedTable:
    try:
        with np.load(Path(path), allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            ids, values = data["ids"], data["values"]
    except (OSError, KeyError, ValueError) as exc:
        raise ConfigError(f"{path}: not a paramshard table export ({exc})") from None
    order = np.argsort(ids, kind="stable")
    return ExportedTable(meta["name"], ids[order], values[order], meta["seed"], meta["init_scale"])
