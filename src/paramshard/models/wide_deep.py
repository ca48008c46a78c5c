"""Wide & Deep (Cheng et al. 2016, "Wide & Deep Learning for Recommender Systems")."""
from __future__ import annotations

import torch

from paramshard.models._common import EmbeddingFactory, FieldModel, dense_linear, mlp


class WideDeep(FieldModel):
    """logit = wide (logistic regression, as LogisticRegression) + MLP(concat(the F field
    embeddings, dense)) -> 1, ReLU between layers. Tables "wide" (dim 1) and "deep" (``dim``).
    With num_dense=13, num_fields=26 (criteo_schema()) this is the CTR demo's model (it was
    examples/ctr_model.py), down to the parameter names (wide, deep, mlp.*, dense_wide.*).
    Multi-task: the MLP's last Linear, the "wide" table and the dense term have T outputs over
    the shared embeddings and hidden layers (DeepFM's FM term, one per row, adds to each)."""

    multi_task = True

    def __init__(self, schema, dim: int = 16, hidden=(400, 400), *, embedding: EmbeddingFactory | None = None,
                 table_optimizer=None, capacity: int = 0, prefix: str = ""):
        super().__init__(schema, embedding, table_optimizer, capacity, prefix, dim=dim)
        self.hidden = tuple(int(h) for h in hidden)
        self.mlp = mlp(self.num_fields * dim + self.num_dense, self.hidden, out=self.tasks)
        self.dense_wide = dense_linear(self.num_dense, self.tasks)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor | None = None,
                weights: torch.Tensor | None = None) -> torch.Tensor:
        batch = self.check(dense, ids, offsets, weights)
        v = self.embed(ids, offsets, weights, batch)                               # [B, F, dim]
        deep = self.logits(self.mlp(torch.cat([v.reshape(batch, -1), dense], dim=1)))     # [B] ([B, T])
        return self.linear_logit(dense, ids, offsets, weights, batch) + deep + self.per_task(self.interaction(v))

    def interaction(self, v: torch.Tensor):
        """A term over the field embeddings of its own (DeepFM's factorization machine); none here."""
        return 0.0

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, hidden={self.hidden}"
