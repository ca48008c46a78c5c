"""DCN-V2 (Wang et al. 2021, "DCN V2: Improved Deep & Cross Network and Practical Lessons for
Web-scale Learning to Rank Systems")."""
from __future__ import annotations

import torch
import torch.nn as nn

from paramshard.errors import ConfigError
from paramshard.models._common import EmbeddingFactory, FieldModel, dense_linear, mlp, out_width

STRUCTURES = ("parallel", "stacked")


class DCNv2(FieldModel):
    """x0 = concat(the F field embeddings, dense), width d. Cross layers
    x_{l+1} = x0 * (W_l x_l + b_l) + x_l with a full d x d matrix W_l (DCN's v1 had a vector),
    or, with ``rank`` r > 0, W_l = U_l V_l^T (U, V: d x r), the paper's cheaper form when d is
    large. ``structure``: "parallel" runs the MLP on x0 beside the cross layers and a Linear
    over concat(cross out, MLP out) gives the logit; "stacked" runs the MLP on the cross
    layers' output, then a Linear. Plus the wide (logistic regression) logit, as every model
    here has (the paper has none: it is one more term, and DCN v1 here has it too)."""

    multi_task = True          # its last layers have self.tasks outputs (models/_common.py)

    def __init__(self, schema, dim: int = 16, cross_layers: int = 3, hidden=(400, 400), rank: int = 0,
                 structure: str = "parallel", *, embedding: EmbeddingFactory | None = None,
                 table_optimizer=None, capacity: int = 0, prefix: str = ""):
        super().__init__(schema, embedding, table_optimizer, capacity, prefix, dim=dim)
        if not isinstance(cross_layers, int) or cross_layers < 1:
            raise ConfigError(f"DCNv2: cross_layers must be a whole number >= 1, got {cross_layers!r}")
        if not isinstance(rank, int) or rank < 0:
            raise ConfigError(f"DCNv2: rank must be a whole number >= 0 (0: full-rank W), got {rank!r}")
        if structure not in STRUCTURES:
            raise ConfigError(f"DCNv2: structure must be one of {', '.join(STRUCTURES)}, got {structure!r}")
        self.cross_layers, self.hidden, self.rank, self.structure = (
            cross_layers, tuple(int(h) for h in hidden), rank, structure)
        width = self.num_fields * dim + self.num_dense
        # One [layers, ...] parameter per kind, not a list per layer: fewer dense blocks to shard.
        # Glorot normal per layer's matrix (the paper's code: glorot); b: zero.
        if rank:
            self.cross_u = nn.Parameter(torch.randn(cross_layers, width, rank) * (2.0 / (width + rank)) ** 0.5)
            self.cross_v = nn.Parameter(torch.randn(cross_layers, width, rank) * (2.0 / (width + rank)) ** 0.5)
        else:
            self.cross_w = nn.Parameter(torch.randn(cross_layers, width, width) * (1.0 / width) ** 0.5)
        self.cross_b = nn.Parameter(torch.zeros(cross_layers, width))
        self.mlp = mlp(width, self.hidden, out=None)
        tower = out_width(width, self.hidden)
        self.head = nn.Linear(width + tower if structure == "parallel" else tower, self.tasks)
        self.dense_wide = dense_linear(self.num_dense, self.tasks)

    def cross(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        for layer in range(self.cross_layers):
            if self.rank:      # (x V) U^T: two thin products, O(d r) per row instead of O(d^2)
                wx = (x @ self.cross_v[layer]) @ self.cross_u[layer].T
            else:
                wx = x @ self.cross_w[layer].T
            x = x0 * (wx + self.cross_b[layer]) + x
        return x

    def forward(self, dense: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor | None = None,
                weights: torch.Tensor | None = None) -> torch.Tensor:
        batch = self.check(dense, ids, offsets, weights)
        x0 = torch.cat([self.embed(ids, offsets, weights, batch).reshape(batch, -1), dense], dim=1)
        crossed = self.cross(x0)
        if self.structure == "parallel":
            top = torch.cat([crossed, self.mlp(x0)], dim=1)
        else:
            top = self.mlp(crossed)
        return self.linear_logit(dense, ids, offsets, weights, batch) + self.logits(self.head(top))

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, cross_layers={self.cross_layers}, rank={self.rank}, "
                f"structure={self.structure!r}, hidden={self.hidden}")
