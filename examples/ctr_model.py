"""Wide & deep CTR model, shared by the CTR example and the benchmarks.

The embedding tables come from a factory, so the same model runs on
paramshard's SparseEmbedding (rows on the servers) or on a plain
nn.EmbeddingBag (one process, ids already mapped to 0..vocab-1).
"""
import torch
import torch.nn as nn

NUM_DENSE, NUM_FIELDS = 13, 26


class WideDeep(nn.Module):
    def __init__(self, embedding, dim: int = 16, hidden=(400, 400)):
        """``embedding(name, dim)`` returns a module mapping ids [B, L] -> [B, dim] (sum)."""
        super().__init__()
        self.dim = dim
        self.wide = embedding("wide", 1)          # logistic regression over every feature
        self.deep = embedding("deep", dim)        # one row per (field, value): ids are field-distinct
        layers, width = [], NUM_FIELDS * dim + NUM_DENSE
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)
        self.dense_wide = nn.Linear(NUM_DENSE, 1)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        batch = ids.shape[0]
        wide = self.wide(ids) + self.dense_wide(dense)                      # [B, 1]
        deep = self.deep(ids.reshape(batch * NUM_FIELDS, 1)).view(batch, NUM_FIELDS * self.dim)
        return (wide + self.mlp(torch.cat([deep, dense], dim=1))).squeeze(1)
