"""A fixed part of a file's rows held out (for validation), chosen without reading anything twice.

Record r (its number in the files read in order, bad lines counted, as the
readers' ``shard=`` counts them) is held out when a hash of (seed, r) falls
below ``fraction``: every trainer, and the evaluating chief, agree on the split
without talking or writing a file, it is the same in every run with the same
seed, and it is spread evenly over the file (no "the last 10%", which is often
the newest and least like the rest). ``part="rest"`` reads the other rows (the
training rows), ``part="held"`` the held-out ones.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import ConfigError
from ..placement.sparse_hash import mix64

PARTS = ("rest", "held")
_SALT = np.uint64(0x5EED_0F_4E1D_0A7)      # held-out choices differ from any other use of mix64
_COUNT_CHUNK = 1 << 22                      # records hashed at once when counting a part


@dataclasses.dataclass(frozen=True)
class Holdout:
    fraction: float
    seed: int = 0
    part: str = "rest"

    def __post_init__(self):
        if not 0.0 < self.fraction < 1.0:
            raise ConfigError(f"held-out fraction {self.fraction!r}: must be between 0 and 1 (exclusive)")
        if self.part not in PARTS:
            raise ConfigError(f"held-out part {self.part!r}: one of {', '.join(PARTS)}")

    def other(self) -> "Holdout":
        """The complementary part (the validation rows of a training split, and back)."""
        return dataclasses.replace(self, part="held" if self.part == "rest" else "rest")

    def mask(self, records: np.ndarray) -> np.ndarray:
        """True where record number ``records[i]`` belongs to this part."""
        key = np.asarray(records, np.int64).astype(np.uint64) ^ (_SALT + np.uint64(self.seed & (2**63 - 1)))
        # The top 53 bits as a uniform number in [0, 1): exact in float64.
        uniform = (mix64(key) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
        held = uniform < self.fraction
        return held if self.part == "held" else ~held

    def per_shard(self, total: int, shards: int = 1) -> np.ndarray:
        """Records of this part among 0..total-1 owned by each of ``shards`` shards
        (shard i owns r % shards == i, as the readers' ``shard=(i, shards)``)."""
        kept = np.zeros(shards, np.int64)
        for start in range(0, total, _COUNT_CHUNK):
            records = np.arange(start, min(total, start + _COUNT_CHUNK), dtype=np.int64)
            kept += np.bincount(records[self.mask(records)] % shards, minlength=shards)
        return kept
