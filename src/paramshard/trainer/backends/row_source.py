"""``RowSource``: where a SparseEmbedding's forward reads its rows while it trains.

The backend makes one per table (``TrainerBackend.row_source``) and the Trainer attaches it to
the table (``SparseEmbedding.attach``), so the forward calls down into the backend instead of
up into the Trainer. A row source is ``source(ids, training) -> float32 [len(ids), dim]``:
the rows of the batch's distinct ids for the forward of the trainer's current step (its
``TrainerProgress``), created on the servers in training mode only. A failure the trainer's
RecoveryPolicy admits rolls the trainer back (``TrainerProgress.roll_back_in_forward``: the
step this forward belongs to is void) and the rows are read again at the restored step.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from paramshard.errors import ParamshardError

if TYPE_CHECKING:
    from paramshard.trainer.progress import TrainerProgress


class RowSource:
    trainable = True        # SparseEmbedding keeps these rows' gradients (a served model's are constants)

    def __init__(self, backend, table: str, dim: int, progress: TrainerProgress):
        self.backend, self.table, self.dim, self.progress = backend, table, dim, progress

    def __call__(self, ids: np.ndarray, training: bool) -> np.ndarray:
        try:
            return self.backend.rows(self.table, ids, self.dim, self.progress.step, training)
        except ParamshardError as exc:
            self.progress.roll_back_in_forward(exc)     # re-raises unless the policy admits it
            return self.backend.rows(self.table, ids, self.dim, self.progress.step, training)

    def __repr__(self) -> str:
        return f"RowSource({self.table!r}, dim={self.dim})"
