"""A GEO trainer's own state in a checkpoint: its local optimizer's slots and update counts.

The servers' part of a checkpoint holds the merged values (every trainer sends its round before
the checkpoint: Trainer.save flushes). What is each trainer's own (Adam's moments, Adagrad's
sums, the per-row update counts, the learning-rate scales) is saved beside its position file,
``trainers/step-N/geo-trainer-<id>.npz`` (pruned with the checkpoint, written before the position
so a position always has it), and put back on resume and rollback: a resumed run then trains as
an uninterrupted one (one trainer: bit for bit). The rows' values are not in it: the replica
pulls them from the restored servers when it next reads them.

``np.savez`` / ``np.load(allow_pickle=False)``: plain arrays, never pickles.
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from paramshard.checkpoint.format import Checkpoint, step_dir_name
from paramshard.checkpoint.paths import confined
from paramshard.checkpoint.errors import CheckpointError
from paramshard.geo.replica import DenseReplica, TableReplica

SEP = "::"


def relpath(step: int, trainer: int) -> str:
    return f"trainers/{step_dir_name(step)}/geo-trainer-{int(trainer)}.npz"


def save(root, step: int, trainer: int, dense: DenseReplica, tables: dict[str, TableReplica],
         lr_scales: dict[str, float]) -> Path:
    arrays: dict[str, Any] = {"steps": np.array(dense.steps, np.int64)}
    for name, slots in dense.slots.items():
        for i, slot in enumerate(slots):
            arrays[f"dense{SEP}{name}{SEP}{i}"] = slot
    for name, t in tables.items():
        n = t.rows
        arrays[f"table{SEP}{name}{SEP}ids"] = t.index.ids[:n]
        arrays[f"table{SEP}{name}{SEP}counts"] = t.counts[:n]
        for i, slot in enumerate(t.slots):
            arrays[f"table{SEP}{name}{SEP}slot{SEP}{i}"] = slot[:n]
    for name, scale in lr_scales.items():
        arrays[f"lr{SEP}{name}"] = np.array(scale, np.float64)
    path = Path(root) / relpath(step, trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise CheckpointError(f"{path}: cannot write trainer {trainer}'s GEO optimizer state ({exc})") from exc
    return path


def load(ckpt: Checkpoint, trainer: int, dense: DenseReplica, tables: dict[str, TableReplica]) -> dict[str, float]:
    """Put trainer ``trainer``'s saved state into ``dense`` and ``tables`` (fresh replicas);
    returns its learning-rate scales. A checkpoint without it (written in another mode, or by a
    trainer that saved none) leaves fresh optimizer state."""
    rel = relpath(ckpt.step, trainer)
    path = confined(ckpt.root, rel, "GEO trainer state")
    if not path.is_file():
        return {}
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable GEO trainer state ({exc})") from exc

    def take(key: str, like: np.ndarray) -> np.ndarray:
        got = arrays.get(key)
        if got is None or got.dtype != like.dtype or got.shape[1:] != like.shape[1:]:
            raise CheckpointError(f"{path}: {key} is {None if got is None else (got.dtype, got.shape)}, this "
                                  f"model's is {like.dtype} [*, {list(like.shape[1:])}]: is it the checkpoint's model "
                                  f"and optimizer?")
        return got

    dense.steps = int(arrays.get("steps", 0))
    for name, slots in dense.slots.items():
        for i, slot in enumerate(slots):
            got = take(f"dense{SEP}{name}{SEP}{i}", slot)
            if got.shape != slot.shape:
                raise CheckpointError(f"{path}: parameter {name}'s optimizer slot is {got.shape}, here {slot.shape}")
            slot[...] = got
    for name, t in tables.items():
        key = f"table{SEP}{name}{SEP}ids"
        if key not in arrays:
            continue
        ids = take(key, t.index.ids)
        t.restore(ids, take(f"table{SEP}{name}{SEP}counts", t.counts),
                  [take(f"table{SEP}{name}{SEP}slot{SEP}{i}", s) for i, s in enumerate(t.slots)])
    return {k.split(SEP, 1)[1]: float(v) for k, v in arrays.items() if k.startswith(f"lr{SEP}")}
