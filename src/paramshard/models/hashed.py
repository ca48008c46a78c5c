"""Tables every trainer holds whole: ids hashed into a fixed number of rows.

Collective mode has no servers for SparseEmbedding tables. A CTR model can still
run there with ``embedding=hashed_embedding(buckets)``: per table a
``torch.nn.EmbeddingBag(buckets, dim)`` whose ids are hashed into ``buckets``
rows (the splitmix64 finaliser, salted per table, then the low bits; a plain
modulo would keep the low bits of hashed feature ids and let equal values of
two fields share a row). The table is a dense parameter: every trainer keeps
a copy and every step allreduces its whole gradient, so memory and traffic
grow with ``buckets`` while collisions shrink with it (benchmarks/modes.py
measures the trade against sparse tables on servers).

``optimizer=`` (e.g. ``ps.optim.Adagrad(lr=0.05)``) trains the table's rows with
their own rule, as a SparseEmbedding's are on the servers, instead of the
Trainer's dense optimizer: only the rows a step looked up change
(collective/allreduce_sync.py), so a CTR model learns with the same settings
in collective mode as with servers.
"""
from __future__ import annotations

import zlib

import numpy as np
import torch
import torch.nn as nn

from paramshard.errors import ConfigError
from paramshard.placement.sparse_hash import initial_rows, mix64

DEFAULT_INIT_SCALE = 0.01      # SparseEmbedding's default: rows start in [-0.01, 0.01)


class HashedEmbeddingBag(nn.EmbeddingBag):
    """``EmbeddingBag(buckets, dim, mode="sum")`` taking any int64 (uint64 bits) ids."""

    def __init__(self, name: str, buckets: int, dim: int, init_scale: float = DEFAULT_INIT_SCALE,
                 optimizer=None):
        if buckets < 1 or buckets & (buckets - 1):
            raise ConfigError(f"hashed table {name!r}: buckets={buckets} must be a power of two")
        if optimizer is not None:
            from paramshard.optim import OptimizerConfig
            if not isinstance(optimizer, OptimizerConfig):
                raise ConfigError(f"hashed table {name!r}: optimizer must be a paramshard.optim config "
                                  f"(e.g. paramshard.optim.Adagrad(lr=0.05)), got {type(optimizer).__name__}")
        self.salt = np.uint64(zlib.crc32(name.encode()))
        # Rows as SparseEmbedding would start them for ids 0..buckets-1: nothing drawn from
        # torch's generator, so the rest of the model initialises as it does with sparse tables.
        weight = torch.from_numpy(initial_rows(int(self.salt), np.arange(buckets, dtype=np.uint64), dim, init_scale))
        super().__init__(buckets, dim, mode="sum", _weight=weight)
        self.table_name = name
        self.row_optimizer = optimizer

    def rows_of(self, ids: torch.Tensor) -> torch.Tensor:
        hashed = mix64(ids.detach().contiguous().numpy().view(np.uint64) ^ self.salt)
        return torch.from_numpy((hashed & np.uint64(self.num_embeddings - 1)).astype(np.int64))

    def forward(self, ids, offsets=None, per_sample_weights=None):
        return super().forward(self.rows_of(ids), offsets, per_sample_weights)

    def extra_repr(self) -> str:
        return f"{self.table_name!r}, buckets={self.num_embeddings}, dim={self.embedding_dim}"


def hashed_embedding(buckets: int, init_scale: float = DEFAULT_INIT_SCALE, optimizer=None):
    """An ``embedding=`` factory for the CTR models (paramshard.models): tables of ``buckets``
    rows, trained by ``optimizer`` (None: the Trainer's dense optimizer)."""
    def make(name: str, dim: int) -> nn.Module:
        return HashedEmbeddingBag(name, buckets, dim, init_scale, optimizer)
    # What build_model records (specs/model_spec.py), so a model file can build these tables again
    # (their optimizer is how they train, not what they compute: not recorded).
    # A function's own attributes are not part of its type: the checker cannot know this one.
    make.paramshard_spec = {  # type: ignore[attr-defined]
        "kind": "hashed", "buckets": int(buckets), "init_scale": float(init_scale)}
    return make
