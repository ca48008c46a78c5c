"""Logistic regression on the feature ids and the dense features: the linear baseline of
CTR prediction (McMahan et al. 2013, "Ad Click Prediction: a View from the Trenches")."""
from __future__ import annotations

import torch

from paramshard.models._common import EmbeddingFactory, FieldModel, dense_linear


class LogisticRegression(FieldModel):
    """logit = sum over fields of the field's "wide" weight + Linear(D, 1)(dense).
    One dim-1 table, "wide"; the dense linear term holds the bias (only it when D = 0).
    Multi-task: the "wide" table has one weight per task (dim T), the dense term T outputs."""

    multi_task = True

    def __init__(self, schema, embedding: EmbeddingFactory | None = None, *, table_optimizer=None,
                 capacity: int = 0, prefix: str = ""):
        super().__init__(schema, embedding, table_optimizer, capacity, prefix)
        self.dense_wide = dense_linear(self.num_dense, self.tasks)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor | None = None,
                weights: torch.Tensor | None = None) -> torch.Tensor:
        batch = self.check(dense, ids, offsets, weights)
        return self.linear_logit(dense, ids, offsets, weights, batch)
