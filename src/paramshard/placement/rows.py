"""Row-wise array helpers shared by trainers and servers."""
from __future__ import annotations

import numpy as np


def merge_duplicates(ids: np.ndarray, grads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sum the gradient rows of equal ids; ids come back sorted (sort + reduceat, vectorised)."""
    if len(ids) == 0:
        return ids, grads
    order = np.argsort(ids, kind="stable")
    ids_sorted = ids[order]
    starts = np.flatnonzero(np.r_[True, ids_sorted[1:] != ids_sorted[:-1]])
    if len(starts) == len(ids):
        return ids_sorted, grads[order]
    return ids_sorted[starts], np.add.reduceat(grads[order], starts, axis=0)
