"""A small model with a dense part and a SparseEmbedding table, and its data, for GEO mode's
oracles (tests/integration/test_geo_*.py): the same seed gives the same initial values and
batches, so two runs differ only by how they train."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import paramshard as ps
from paramshard.trainer.trainer import Trainer

IDS, BAG, DIM = 40, 3, 4


class TinyCTR(nn.Module):
    def __init__(self, table_optimizer, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = ps.SparseEmbedding("emb", DIM, optimizer=table_optimizer, init_scale=0.1)
        self.mlp = nn.Sequential(nn.Linear(DIM + 5, 8), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, ids, x):
        return self.mlp(torch.cat([self.emb(ids), x], dim=1)).squeeze(1)


def batches(steps: int, batch: int, seed: int = 1):
    """``steps`` batches (ids [batch, BAG], x [batch, 5], y [batch])."""
    g = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        ids = torch.from_numpy(g.integers(0, IDS, (batch, BAG)).astype(np.int64))
        x = torch.from_numpy(g.standard_normal((batch, 5)).astype(np.float32))
        y = torch.from_numpy((g.random(batch) < 0.3).astype(np.float32))
        out.append((ids, x, y))
    return out


def train(env, data, dense_optimizer, table_optimizer, close: bool = True, prefetch: bool = False):
    """Train ``data`` on one trainer of ``env`` (``prefetch``: through Trainer.prefetching);
    returns (model, trainer)."""
    model = TinyCTR(table_optimizer)
    trainer = Trainer(model, dense_optimizer, env=env)
    for ids, x, y in (trainer.prefetching(data) if prefetch else data):
        trainer.step(F.binary_cross_entropy_with_logits(model(ids, x), y))
    if close:
        trainer.close()
    return model, trainer


def split(batch, parts: int, part: int):
    """Trainer ``part``'s share of a global batch (contiguous rows)."""
    n = len(batch[0]) // parts
    return tuple(t[part * n:(part + 1) * n] for t in batch)


def dense_of(model) -> dict[str, np.ndarray]:
    return {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
