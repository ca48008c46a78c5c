"""DIN (Zhou et al. 2018, "Deep Interest Network for Click-Through Rate Prediction"): attention
of a user's behaviour sequence to the candidate being scored.

The schema says which bag column is a behaviour sequence and which categorical column is its
candidate (``sequence_of``, `schema infer --sequence hist_item_ids:item_id`); the two share an
id space (specs/schema.py), so both look up the same rows of the one "deep" table: the item a
user clicked and the item shown are one embedding, the point of the model.

Per sequence: the ids of its bag, in the cell's order (oldest first), become ``max_len``
positions, the most recent ``max_len`` kept (the last ones of the cell), the rest padding
with a mask; a local activation unit (an MLP over [e_s, e_c, e_s - e_c, e_s * e_c] -> one
weight, no softmax, as the paper) weighs each position against the candidate's embedding;
the padded positions weigh nothing (masked to 0); the sequence's vector is the weighted sum.

What this makes DIN invariant to: the sum has no position term (the paper has none), so
permuting the kept positions (reversing a history shorter than ``max_len``) leaves the score
unchanged; order matters only through which positions are kept when a history is longer than
``max_len`` (the most recent), and through nothing else. Padding and a history's mean-pooling
weights from the encoder (1/len) change nothing here: positions weigh by attention only.

Activation: PReLU (the paper's baseline activation; its Dice needs batch statistics, which would
make a row's training score depend on its batch and add running statistics to every served and
exported model), one learned slope per layer, in the activation unit and the MLP.

logit = linear (logistic regression over every field, the sequence's bag mean-pooled in the
"wide" table, as the other models here have) + MLP(concat(the other fields' embeddings, each
sequence's attention-pooled vector in its field's place, dense)) -> 1.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from paramshard.errors import ConfigError
from paramshard.models._common import EmbeddingFactory, FieldModel, dense_linear

NEEDS_SEQUENCE = ("DIN needs a behaviour sequence in the schema: a bag column with sequence_of naming its "
                  "candidate column (`paramshard schema infer FILE --sequence hist_item_ids:item_id`, then "
                  "`schema fit`); for tables without one, choose another model (e.g. --model deepfm)")


def prelu_mlp(width: int, hidden, out: int = 1) -> nn.Sequential:
    """Linear+PReLU per hidden width, then Linear(-, out)."""
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(width, int(h)), nn.PReLU()]
        width = int(h)
    layers.append(nn.Linear(width, out))
    return nn.Sequential(*layers)


def bags(offsets: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(bag of each of the n ids, length of each bag) from bag offsets, in tensor operations only
    (no Python number from the data: an exported trace keeps working for any batch)."""
    starts = torch.zeros(n + 1, dtype=torch.int64, device=offsets.device).index_add(0, offsets,
                                                                                      torch.ones_like(offsets))
    bag = torch.cumsum(starts[:n], dim=0) - 1
    counts = torch.zeros(offsets.shape[0], dtype=torch.int64, device=offsets.device).index_add(
        0, bag, torch.ones_like(bag))
    return bag, counts


def positions(rows: torch.Tensor, start: torch.Tensor, count: torch.Tensor, max_len: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, max_len, dim] the last ``max_len`` rows of each bag in order, padding zeros after;
    [B, max_len] mask, True at a real position). ``rows``: [N, dim] one per id; a bag b holds
    rows[start[b]:start[b] + count[b]]."""
    keep = torch.clamp(count, max=max_len)
    first = start + count - keep                                     # the most recent max_len
    j = torch.arange(max_len, dtype=torch.int64, device=rows.device)
    mask = j.unsqueeze(0) < keep.unsqueeze(1)
    index = torch.where(mask, first.unsqueeze(1) + j.unsqueeze(0), torch.zeros_like(mask, dtype=torch.int64))
    return rows[index] * mask.unsqueeze(2).to(rows.dtype), mask


class ActivationUnit(nn.Module):
    """The paper's local activation unit: a position's weight from [e_s, e_c, e_s - e_c, e_s * e_c]."""

    def __init__(self, dim: int, hidden):
        super().__init__()
        self.mlp = prelu_mlp(4 * dim, hidden)

    def forward(self, seq: torch.Tensor, cand: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[B, dim]: sum over positions of weight * e_s; padded positions weigh 0."""
        c = cand.unsqueeze(1).expand_as(seq)
        weight = self.mlp(torch.cat([seq, c, seq - c, seq * c], dim=2)).squeeze(2)      # [B, L], no softmax
        weight = weight * mask.to(weight.dtype)
        return (weight.unsqueeze(2) * seq).sum(dim=1)


class DIN(FieldModel):
    """DIN over the schema's behaviour sequences (``schema.sequences``: (sequence field, candidate
    field) pairs); ``max_len``: positions kept per sequence, the most recent."""

    multi_task = True          # its last layers have self.tasks outputs (models/_common.py)

    def __init__(self, schema, dim: int = 16, hidden=(200, 80), attention_hidden=(36,), max_len: int = 50, *,
                 embedding: EmbeddingFactory | None = None, table_optimizer=None, capacity: int = 0,
                 prefix: str = ""):
        super().__init__(schema, embedding, table_optimizer, capacity, prefix, dim=dim)
        pairs = [(int(s), int(c)) for s, c in getattr(schema, "sequences", ())]
        if not pairs:
            raise ConfigError(NEEDS_SEQUENCE)
        if not isinstance(max_len, int) or max_len < 1:
            raise ConfigError(f"DIN: max_len must be a whole number >= 1, got {max_len!r}")
        self.pairs, self.max_len = pairs, max_len
        self.hidden, self.attention_hidden = tuple(int(h) for h in hidden), tuple(int(h) for h in attention_hidden)
        self.attention = nn.ModuleList(ActivationUnit(dim, self.attention_hidden) for _ in pairs)
        self.mlp = prelu_mlp(self.num_fields * dim + self.num_dense, self.hidden, self.tasks)
        self.dense_wide = dense_linear(self.num_dense, self.tasks)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor | None = None,
                weights: torch.Tensor | None = None) -> torch.Tensor:
        batch = self.check(dense, ids, offsets, weights)
        F = self.num_fields
        # ONE lookup of every id (one row each): the prefetcher matches this view of the batch's
        # ids (models/_common.lookup says why), and the fields are pooled from these rows below.
        rows = self.deep(ids.reshape(-1, 1))                                      # [N, dim]
        # One id per field (no offsets): bags of one.
        starts = offsets if offsets is not None else torch.arange(batch * F, dtype=torch.int64, device=ids.device)
        bag, counts = bags(starts, rows.shape[0])
        weighted = rows if weights is None else rows * weights.unsqueeze(1)
        fields = torch.zeros(batch * F, rows.shape[1], dtype=rows.dtype, device=rows.device).index_add(
            0, bag, weighted).view(batch, F, -1)                                  # as EmbeddingBag pools
        starts, counts = starts.view(batch, F), counts.view(batch, F)
        parts = list(fields.unbind(1))
        for unit, (s, c) in zip(self.attention, self.pairs):
            seq, mask = positions(rows, starts[:, s], counts[:, s], self.max_len)
            parts[s] = unit(seq, fields[:, c], mask)
        deep = self.logits(self.mlp(torch.cat(parts + [dense], dim=1)))
        return self.linear_logit(dense, ids, offsets, weights, batch) + deep

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, sequences={self.pairs}, max_len={self.max_len}, "
                f"attention_hidden={self.attention_hidden}, hidden={self.hidden}")
