"""Sparse tables as one file: what every server held, merged, for inference or a new job.

The file is a plain .npz (ids uint64 sorted, values float32 [rows, dim], and
the table's settings as JSON), readable with numpy alone.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import uuid
from pathlib import Path
from typing import Iterator

import numpy as np

from paramshard.errors import ConfigError
from paramshard.placement.sparse_hash import initial_rows


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
        """Rows for ``ids``: any shape the model takes (e.g. ``[batch, bag]``), as a torch
        tensor, numpy array or list; int64 ids are read as uint64 bit patterns, as the
        model does. Returns ``ids.shape + (dim,)`` float32. An id the table never stored
        gets its deterministic initial row (what training would have used) or zeros
        (``unknown="zeros"``)."""
        if unknown not in ("initial", "zeros"):
            raise ConfigError(f"unknown={unknown!r}: expected 'initial' or 'zeros'")
        ids = _as_uint64(ids)
        flat = ids.reshape(-1)
        if unknown == "initial":
            out = initial_rows(self.seed, flat, self.dim, self.init_scale)
        else:
            out = np.zeros((len(flat), self.dim), np.float32)
        if len(self.ids):
            pos = np.minimum(np.searchsorted(self.ids, flat), len(self.ids) - 1)
            found = self.ids[pos] == flat
            out[found] = self.values[pos[found]]
        return out.reshape(ids.shape + (self.dim,))


def _as_uint64(ids) -> np.ndarray:
    """Feature ids as uint64, the convention of paramshard.trainer.sparse_embedding.as_uint64
    (int64 bit patterns reinterpreted), without importing torch here."""
    if hasattr(ids, "detach") and hasattr(ids, "numpy"):    # a torch tensor
        ids = ids.detach().cpu().numpy()
    ids = np.asarray(ids)
    if ids.dtype == np.uint64:
        return ids
    if ids.dtype.kind not in "iu":
        if ids.size:
            raise ConfigError(f"feature ids must be integers, got {ids.dtype}")
        ids = ids.astype(np.int64)          # np.asarray([]) is float64
    return ids.astype(np.int64, copy=False).view(np.uint64)


@contextlib.contextmanager
def replaced_into_place(path) -> Iterator[Path]:
    """A temporary name next to ``path`` to write; moved onto ``path`` with one
    os.replace when the block ends without error, deleted otherwise. Readers (and a
    second run writing the same file) never see a half-written file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def save_table(path, meta: dict, ids: np.ndarray, values: np.ndarray) -> None:
    """``meta``: name, dim, seed, init_scale, optimizer (as export_sparse returns them)."""
    meta = {**meta, "format": 1}
    with replaced_into_place(path) as tmp, open(tmp, "wb") as f:   # a file object: numpy adds no ".npz"
        np.savez(f, ids=ids, values=values, meta=np.array(json.dumps(meta)))


def load_table(path) -> ExportedTable:
    from paramshard.checkpoint.model_archive import ModelArchiveError, NotAnArchive, check_npz
    try:
        check_npz(path)          # before np.load believes a shape in it (checkpoint/model_archive.py)
    except NotAnArchive as exc:
        raise ConfigError(f"{path}: not a paramshard table export ({exc})") from None
    except ModelArchiveError as exc:
        raise ConfigError(f"{path}: refused before reading it: {exc}. Nothing was allocated for it; export the "
                          f"table again (`paramshard export --table`): a file that was sent or edited is not "
                          f"trusted") from None
    except OSError as exc:
        raise ConfigError(f"{path}: not a paramshard table export ({exc})") from None
    try:
        with np.load(Path(path), allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            ids, values = data["ids"], data["values"]
    except (OSError, KeyError, ValueError) as exc:
        raise ConfigError(f"{path}: not a paramshard table export ({exc})") from None
    order = np.argsort(ids, kind="stable")
    return ExportedTable(meta["name"], ids[order], values[order], meta["seed"], meta["init_scale"])
