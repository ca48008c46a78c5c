"""xDeepFM (Lian et al. 2018, "xDeepFM: Combining Explicit and Implicit Feature Interactions
for Recommender Systems")."""
from __future__ import annotations

import torch
import torch.nn as nn

from paramshard.errors import ConfigError
from paramshard.models._common import EmbeddingFactory, FieldModel, dense_linear, mlp


class CIN(nn.Module):
    """Compressed Interaction Network over X0 = [B, F, k] field embeddings. Layer l makes
    H_l feature maps, each a weighted sum over every pair (map i of X_{l-1}, field j of X0) of
    their elementwise product: X_l[h] = sum_ij W_l[h, i, j] (X_{l-1}[i] * X0[j]) + b_l[h], a
    1x1 convolution over the F * H_{l-1} products. Each map is summed over k (sum pooling);
    the pooled maps of every layer, concatenated, are the output. ``split_half`` (the paper's
    code): a layer but the last sends half its maps to the output and half to the next layer,
    halving the next layer's products at little loss."""

    def __init__(self, fields: int, layers, split_half: bool = True):
        super().__init__()
        self.layers, self.split_half = tuple(int(h) for h in layers), bool(split_half)
        if not self.layers or min(self.layers) < 1:
            raise ConfigError(f"xDeepFM: cin_layers must be widths >= 1, got {layers!r}")
        if split_half and any(h % 2 for h in self.layers[:-1]):
            raise ConfigError(f"xDeepFM: with split_half, every CIN width but the last must be even, got {layers!r}")
        self.convs = nn.ModuleList()
        previous, self.out_width = fields, 0
        for i, h in enumerate(self.layers):
            self.convs.append(nn.Conv1d(previous * fields, h, kernel_size=1))
            last = i == len(self.layers) - 1
            previous = h // 2 if split_half and not last else h
            self.out_width += h // 2 if split_half and not last else h

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        batch, fields, k = x0.shape
        x, pooled = x0, []
        for i, conv in enumerate(self.convs):
            # [B, H, 1, k] * [B, 1, F, k] -> every (map, field) product, flattened for the conv
            z = (x.unsqueeze(2) * x0.unsqueeze(1)).reshape(batch, -1, k)
            maps = conv(z)                                          # [B, H_l, k]; identity activation as the paper
            if self.split_half and i < len(self.convs) - 1:
                x, out = torch.split(maps, maps.shape[1] // 2, dim=1)
            else:
                x = out = maps
            pooled.append(out.sum(dim=2))
        return torch.cat(pooled, dim=1)


class XDeepFM(FieldModel):
    """logit = linear (logistic regression: "wide" table + dense linear) + Linear(CIN(the F
    field embeddings)) + MLP(concat(the same embeddings, dense)) -> 1. CIN and MLP share the
    "deep" table, as in the paper. The CIN costs about H_l * H_{l-1} * F * dim multiply-adds per
    row and layer: with Adult's 14 fields and 2 x 128 maps, an epoch takes ~4.5x DeepFM's CPU
    time (``cin_layers=(32, 32)`` for a cheaper one)."""

    multi_task = True          # its last layers have self.tasks outputs (models/_common.py)

    def __init__(self, schema, dim: int = 16, hidden=(400, 400), cin_layers=(128, 128), split_half: bool = True, *,
                 embedding: EmbeddingFactory | None = None, table_optimizer=None, capacity: int = 0,
                 prefix: str = ""):
        super().__init__(schema, embedding, table_optimizer, capacity, prefix, dim=dim)
        self.hidden = tuple(int(h) for h in hidden)
        self.cin = CIN(self.num_fields, cin_layers, split_half)
        self.cin_head = nn.Linear(self.cin.out_width, self.tasks)
        self.mlp = mlp(self.num_fields * dim + self.num_dense, self.hidden, out=self.tasks)
        self.dense_wide = dense_linear(self.num_dense, self.tasks)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor | None = None,
                weights: torch.Tensor | None = None) -> torch.Tensor:
        batch = self.check(dense, ids, offsets, weights)
        v = self.embed(ids, offsets, weights, batch)                                # [B, F, dim]
        deep = self.logits(self.mlp(torch.cat([v.reshape(batch, -1), dense], dim=1)))
        cin = self.logits(self.cin_head(self.cin(v)))
        return self.linear_logit(dense, ids, offsets, weights, batch) + cin + deep

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, cin_layers={self.cin.layers}, split_half={self.cin.split_half}, "
                f"hidden={self.hidden}")
