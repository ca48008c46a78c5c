"""``--trained-log DIR``: what each trainer process trained, per epoch, so that "every training
row once per epoch" can be checked from outside whoever came and went (an elastic job's
leavers and joiners): ``DIR/trained-<slot>-<pid>.jsonl``, one line per epoch it trained in,
``{"epoch", "rows", "id_sum"}``; ``id_sum`` is the sum of every trained row's encoded ids,
modulo 2**64, so a row trained twice and another never would not cancel out in the rows
alone. Summed over the files, an epoch's figures equal those of one pass over --train's
training rows (tests/e2e/test_ctr_app.py computes them with a TabularReader)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np


def id_sum(ids) -> int:
    """Sum of the ids (a numpy array or a torch tensor), modulo 2**64."""
    values = ids.numpy() if hasattr(ids, "numpy") else np.asarray(ids)
    return int(np.asarray(values, np.int64).view(np.uint64).sum(dtype=np.uint64))


class TrainedLog:
    def __init__(self, folder, trainer_id: int):
        Path(folder).mkdir(parents=True, exist_ok=True)
        self.path = Path(folder) / f"trained-{trainer_id}-{os.getpid()}.jsonl"
        self.rows = self.sum = 0

    def add(self, batch: dict) -> None:
        self.rows += len(batch["labels"])
        self.sum = (self.sum + id_sum(batch["ids"])) % (1 << 64)

    def epoch_done(self, epoch: int) -> None:
        if self.rows:
            with open(self.path, "a") as f:
                f.write(json.dumps({"epoch": epoch, "rows": self.rows, "id_sum": self.sum}) + "\n")
        self.rows = self.sum = 0
