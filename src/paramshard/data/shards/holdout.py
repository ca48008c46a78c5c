"""A fixed part of a file's rows held out (for validation), chosen without reading anything twice.

Record r (its number in the files read in order, bad lines counted, as the
readers' ``shard=`` counts them) is held out when a hash of (seed, r) falls
below ``fraction``: every trainer, and the evaluating chief, agree on the split
without talking or writing a file, it is the same in every run with the same
seed, and it is spread evenly over the file (no "the last 10%", which is often
the newest and least like the rest). ``part="rest"`` reads the other rows (the
training rows), ``part="held"`` the held-out ones.

``by="content"``: record r is held out when a hash of (seed, its fields as read) falls
below ``fraction`` instead. A reader of one shard task (data/shards/tasks.py: a byte range, a
row group) does not know the number of its records, but it has their fields: so this is
the rule of a job whose data the shard service hands out (DynamicShards), and of the
chief's validation reader in that job, which must agree with it. Identical rows fall in
the same part (a duplicated row is trained, or held out, every time it occurs). The
fields are hashed with pandas' deterministic hash (its fixed key, not Python's salted
hash): the same in every process of a job.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from paramshard.errors import ConfigError
from paramshard.placement.sparse_hash import mix64

PARTS = ("rest", "held")
BY = ("record", "content")
_SALT = np.uint64(0x5EED_0F_4E1D_0A7)      # held-out choices differ from any other use of mix64
_COUNT_CHUNK = 1 << 22                      # records hashed at once when counting a part


@dataclasses.dataclass(frozen=True)
class Holdout:
    fraction: float
    seed: int = 0
    part: str = "rest"
    by: str = "record"        # what the hash is of: the record number, or the record's fields

    def __post_init__(self):
        if not 0.0 < self.fraction < 1.0:
            raise ConfigError(f"held-out fraction {self.fraction!r}: must be between 0 and 1 (exclusive)")
        if self.part not in PARTS:
            raise ConfigError(f"held-out part {self.part!r}: one of {', '.join(PARTS)}")
        if self.by not in BY:
            raise ConfigError(f"held-out rule by={self.by!r}: one of {', '.join(BY)}")

    def other(self) -> "Holdout":
        """The complementary part (the validation rows of a training split, and back)."""
        return dataclasses.replace(self, part="held" if self.part == "rest" else "rest")

    def mask(self, records: np.ndarray) -> np.ndarray:
        """True where record number ``records[i]`` belongs to this part (``by="record"``)."""
        if self.by != "record":
            raise ConfigError("this hold-out is by content: use rows_mask(columns), which hashes the fields")
        return self._part(np.asarray(records, np.int64).astype(np.uint64))

    def rows_mask(self, columns: dict) -> np.ndarray:
        """True where row i of ``columns`` ({name: array}, one value per row: the fields a
        reader read) belongs to this part (``by="content"``). Columns are taken in name order,
        so the result does not depend on the order a reader lists them in."""
        if self.by != "content":
            raise ConfigError("this hold-out is by record number: use mask(records)")
        return self._part(content_hashes(columns))

    def _part(self, keys: np.ndarray) -> np.ndarray:
        key = keys ^ (_SALT + np.uint64(self.seed & (2**63 - 1)))
        # The top 53 bits as a uniform number in [0, 1): exact in float64.
        uniform = (mix64(key) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
        held = uniform < self.fraction
        return held if self.part == "held" else ~held

    def per_shard(self, total: int, shards: int = 1) -> np.ndarray:
        """Records of this part among 0..total-1 owned by each of ``shards`` shards
        (shard i owns r % shards == i, as the readers' ``shard=(i, shards)``)."""
        if self.by != "record":
            raise ConfigError("a hold-out by content cannot be counted without reading the rows (equal_steps "
                              "needs the hold-out by record number)")
        kept = np.zeros(shards, np.int64)
        for start in range(0, total, _COUNT_CHUNK):
            records = np.arange(start, min(total, start + _COUNT_CHUNK), dtype=np.int64)
            kept += np.bincount(records[self.mask(records)] % shards, minlength=shards)
        return kept


def content_hashes(columns: dict) -> np.ndarray:
    """One uint64 per row: a deterministic hash of the row's values over ``columns`` in name
    order (strings by their text, numbers by their value's bytes)."""
    import pandas as pd
    names = sorted(columns)
    if not names:
        raise ConfigError("a hold-out by content needs at least one column to hash")
    rows = len(columns[names[0]])
    combined = np.zeros(rows, np.uint64)
    with np.errstate(over="ignore"):
        for i, name in enumerate(names):
            # Text as read (None: a missing Parquet value), never Python's salted hash().
            h = pd.util.hash_array(np.asarray(columns[name]), categorize=False)
            combined = mix64(combined * np.uint64(0x100000001B3) + h + np.uint64(i))
    return combined
