"""AutoInt (Song et al. 2019, "AutoInt: Automatic Feature Interaction Learning via
Self-Attentive Neural Networks"), with the paper's optional DNN (its AutoInt+)."""
from __future__ import annotations

import torch
import torch.nn as nn

from paramshard.errors import ConfigError
from paramshard.models._common import EmbeddingFactory, FieldModel, dense_linear, mlp


class Interacting(nn.Module):
    """One interacting layer: per head, each field attends to every field (softmax over fields
    of <W_Q e_m, W_K e_k>, unscaled as in the paper), the heads' outputs are concatenated, and
    ReLU(that + W_Res e_m) is the field's new vector [heads * head_dim]. W_Q, W_K, W_V and W_Res
    (no biases, as the paper) are one Linear: one matrix product, one dense block to shard."""

    def __init__(self, width: int, heads: int, head_dim: int):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.qkvr = nn.Linear(width, 4 * heads * head_dim, bias=False)

    def forward(self, e: torch.Tensor) -> torch.Tensor:
        batch, fields, _ = e.shape
        q, k, v, res = self.qkvr(e).chunk(4, dim=2)                          # each [B, F, H * d']
        split = lambda t: t.view(batch, fields, self.heads, self.head_dim).transpose(1, 2)  # noqa: E731
        q, k, v = split(q), split(k), split(v)                               # [B, H, F, d']
        attention = torch.softmax(q @ k.transpose(2, 3), dim=3)              # [B, H, F, F]
        out = (attention @ v).transpose(1, 2).reshape(batch, fields, -1)     # heads side by side
        return torch.relu(out + res)


class AutoInt(FieldModel):
    """logit = linear (logistic regression: "wide" table + dense linear) + Linear(the F fields'
    vectors after ``attention_layers`` interacting layers, flattened) + MLP(concat(the field
    embeddings, dense)) -> 1; ``hidden=()``: no MLP (the paper's plain AutoInt). Dense
    features enter the linear term and the MLP, not the attention: they have no embedding here
    (the paper embeds each numeric column; the schema's numeric columns also come as bucket ids,
    which are fields and do attend)."""

    multi_task = True          # its last layers have self.tasks outputs (models/_common.py)

    def __init__(self, schema, dim: int = 16, hidden=(400, 400), attention_layers: int = 3, heads: int = 2,
                 head_dim: int = 8, *, embedding: EmbeddingFactory | None = None, table_optimizer=None,
                 capacity: int = 0, prefix: str = ""):
        super().__init__(schema, embedding, table_optimizer, capacity, prefix, dim=dim)
        for name, value in (("attention_layers", attention_layers), ("heads", heads), ("head_dim", head_dim)):
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"AutoInt: {name} must be a whole number >= 1, got {value!r}")
        self.hidden, self.attention_layers, self.heads, self.head_dim = (
            tuple(int(h) for h in hidden), attention_layers, heads, head_dim)
        self.attention = nn.ModuleList(Interacting(dim if i == 0 else heads * head_dim, heads, head_dim)
                                       for i in range(attention_layers))
        self.attention_head = nn.Linear(self.num_fields * heads * head_dim, self.tasks)
        # No tower at all without widths: mlp(w, ()) would still be a Linear over the embeddings.
        self.mlp = mlp(self.num_fields * dim + self.num_dense, self.hidden, out=self.tasks) if self.hidden else None
        self.dense_wide = dense_linear(self.num_dense, self.tasks)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor | None = None,
                weights: torch.Tensor | None = None) -> torch.Tensor:
        batch = self.check(dense, ids, offsets, weights)
        v = self.embed(ids, offsets, weights, batch)                                # [B, F, dim]
        e = v
        for layer in self.attention:
            e = layer(e)
        out = self.linear_logit(dense, ids, offsets, weights, batch)
        out = out + self.logits(self.attention_head(e.reshape(batch, -1)))
        if self.mlp is not None:
            out = out + self.logits(self.mlp(torch.cat([v.reshape(batch, -1), dense], dim=1)))
        return out

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, attention_layers={self.attention_layers}, heads={self.heads}, "
                f"head_dim={self.head_dim}, hidden={self.hidden}")
