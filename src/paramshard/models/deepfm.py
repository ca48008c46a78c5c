"""DeepFM (Guo et al. 2017, "DeepFM: A Factorization-Machine based Neural Network for CTR Prediction")."""
from __future__ import annotations

import torch

from ._common import EmbeddingFactory, FieldModel, dense_linear, mlp


def fm_interaction(v: torch.Tensor) -> torch.Tensor:
    """[B, F, k] -> [B]: sum over field pairs i < j of <v_i, v_j>, in O(F k) as
    0.5 * sum_k((sum_f v_fk)^2 - sum_f v_fk^2)."""
    return 0.5 * (v.sum(dim=1).pow(2) - v.pow(2).sum(dim=1)).sum(dim=1)


class DeepFM(FieldModel):
    """logit = first order (logistic regression: "wide" table + dense linear) + FM second
    order over the F field embeddings + MLP(concat(the same embeddings, dense)) -> 1.
    The FM and the MLP share the "deep" table, as in the paper."""

    def __init__(self, schema, dim: int = 16, hidden=(400, 400), *, embedding: EmbeddingFactory | None = None,
                 table_optimizer=None, capacity: int = 0, prefix: str = ""):
        super().__init__(schema, embedding, table_optimizer, capacity, prefix, dim=dim)
        self.hidden = tuple(int(h) for h in hidden)
        self.mlp = mlp(self.num_fields * dim + self.num_dense, self.hidden)
        self.dense_wide = dense_linear(self.num_dense)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor | None = None,
                weights: torch.Tensor | None = None) -> torch.Tensor:
        batch = self.check(dense, ids, offsets, weights)
        v = self.embed(ids, offsets, weights, batch)                              # [B, F, dim]
        deep = self.mlp(torch.cat([v.reshape(batch, -1), dense], dim=1)).squeeze(1)
        return self.linear_logit(dense, ids, offsets, weights, batch) + fm_interaction(v) + deep

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, hidden={self.hidden}"
