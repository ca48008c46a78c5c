"""Deep & Cross Network (Wang et al. 2017, "Deep & Cross Network for Ad Click Predictions"; DCN-v1)."""
from __future__ import annotations

import torch
import torch.nn as nn

from paramshard.errors import ConfigError
from paramshard.models._common import EmbeddingFactory, FieldModel, dense_linear, mlp, out_width


class DCN(FieldModel):
    """x0 = concat(the F field embeddings, dense). Cross layers x_{l+1} = x0 * (x_l . w_l) + b_l + x_l
    (w_l, b_l vectors of x0's width) and the MLP tower run on x0 side by side; a Linear over
    concat(cross output, tower output) gives the logit, plus the wide (logistic regression) logit.
    Multi-task: that Linear, the "wide" table and the dense term have T outputs."""

    multi_task = True

    def __init__(self, schema, dim: int = 16, cross_layers: int = 3, hidden=(400, 400), *,
                 embedding: EmbeddingFactory | None = None, table_optimizer=None, capacity: int = 0,
                 prefix: str = ""):
        super().__init__(schema, embedding, table_optimizer, capacity, prefix, dim=dim)
        if not isinstance(cross_layers, int) or cross_layers < 1:
            raise ConfigError(f"DCN: cross_layers must be a whole number >= 1, got {cross_layers!r}")
        self.cross_layers, self.hidden = cross_layers, tuple(int(h) for h in hidden)
        width = self.num_fields * dim + self.num_dense
        # One [layers, width] parameter each, not a list of vectors: fewer dense blocks to shard.
        # w: Glorot normal of a [width, 1] kernel, as the paper's reference code; b: zero.
        self.cross_w = nn.Parameter(torch.randn(cross_layers, width) * (2.0 / (width + 1)) ** 0.5)
        self.cross_b = nn.Parameter(torch.zeros(cross_layers, width))
        self.mlp = mlp(width, self.hidden, out=None)
        self.head = nn.Linear(width + out_width(width, self.hidden), self.tasks)
        self.dense_wide = dense_linear(self.num_dense, self.tasks)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor | None = None,
                weights: torch.Tensor | None = None) -> torch.Tensor:
        batch = self.check(dense, ids, offsets, weights)
        x0 = torch.cat([self.embed(ids, offsets, weights, batch).reshape(batch, -1), dense], dim=1)
        x = x0
        for w, b in zip(self.cross_w, self.cross_b):
            x = x0 * (x @ w).unsqueeze(1) + b + x
        out = self.logits(self.head(torch.cat([x, self.mlp(x0)], dim=1)))
        return self.linear_logit(dense, ids, offsets, weights, batch) + out

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, cross_layers={self.cross_layers}, hidden={self.hidden}"
