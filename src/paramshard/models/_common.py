"""Pieces every CTR model shares: where its tables come from, checking a batch,
looking a table up once for the whole batch, the linear (wide) part, the MLP.

Outputs: ``self.tasks`` per row (models/heads.py): 1 for a binary or regression label (the
model returns [B]), T for T multi-task labels (it returns [B, T]: every layer that makes the
output, the wide table, the dense linear term and the last Linear, has T outputs over the
shared body). A model class that does so sets ``multi_task = True``; build_model refuses a
multi-task schema for the others."""
from __future__ import annotations

import zlib
from typing import Callable

import torch
import torch.nn as nn

from paramshard.errors import ConfigError

EmbeddingFactory = Callable[[str, int], nn.Module]


def default_embedding(table_optimizer=None, capacity: int = 0) -> EmbeddingFactory:
    """Tables on the parameter servers. Imported here, not at the top: paramshard.trainer
    pulls in the trainer and its clients, which building a model does not need."""
    def make(name: str, dim: int) -> nn.Module:
        from paramshard.trainer.sparse_embedding import SparseEmbedding
        # A seed per table: with one shared seed, an id's "wide" weight would start equal to
        # column 0 of its "deep" row (initial rows depend only on seed, id and column).
        return SparseEmbedding(name, dim, optimizer=table_optimizer, capacity=capacity,
                               seed=zlib.crc32(name.encode()) & 0x7FFFFFFF)
    return make


def lookup(table: nn.Module, ids: torch.Tensor, offsets, weights, batch: int, fields: int) -> torch.Tensor:
    """[B, F, dim] field embeddings, from ONE call of ``table`` with the whole batch's ids:
    the prefetcher (trainer/prefetch.py) fetches a table's rows for the tensor its last forward
    read, so a table called per field or on a copy of the ids would miss every prefetch.
    ``reshape`` of the contiguous batch tensor is a view: the same memory, as it needs."""
    if offsets is None:
        rows = table(ids.reshape(batch * fields, 1))
    else:
        rows = table(ids, offsets, per_sample_weights=weights)
    return rows.view(batch, fields, -1)


def mlp(width: int, hidden, out: int | None = 1) -> nn.Sequential:
    """Linear+ReLU per hidden width, then Linear(-, out) unless ``out`` is None (a tower
    whose output feeds another layer). Layer indices match the first demo's model (see WideDeep)."""
    layers = []
    for h in hidden:
        layers += [nn.Linear(width, int(h)), nn.ReLU()]
        width = int(h)
    if out is not None:
        layers.append(nn.Linear(width, out))
    return nn.Sequential(*layers)


def out_width(width: int, hidden) -> int:
    """Width of ``mlp(width, hidden, out=None)``'s output."""
    return int(hidden[-1]) if len(hidden) else width


class Bias(nn.Module):
    """The dense linear term when there are no dense features: nn.Linear(0, 1) would give
    the servers an empty weight block and warn on its init, and only the bias means anything."""

    def __init__(self, out: int = 1):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(out))

    def forward(self, dense: torch.Tensor) -> torch.Tensor:
        return self.bias.expand(dense.shape[0], self.bias.shape[0])


def dense_linear(num_dense: int, out: int = 1) -> nn.Module:
    """The dense features' linear term, [B, D] -> [B, out] (out: the model's tasks), with the
    model's bias. Each model makes it last, after its tower, as the first demo's model did: the
    same torch seed then gives the same initial weights and the parameters come in the same order."""
    return nn.Linear(num_dense, out) if num_dense else Bias(out)


class FieldModel(nn.Module):
    """Base of the CTR models: schema sizes, the tables, the wide (LR) part, input checks.
    A subclass sets ``self.dense_wide = dense_linear(self.num_dense, self.tasks)`` at the end of
    its __init__."""

    multi_task = False          # whether the class gives self.tasks outputs per row (see above)
    dense_wide: nn.Module       # set by the subclass (above)

    def __init__(self, schema, embedding: EmbeddingFactory | None = None, table_optimizer=None,
                 capacity: int = 0, prefix: str = "", dim: int | None = None):
        """``dim``: also make the "deep" table (field embeddings of that width)."""
        super().__init__()
        self.num_dense, self.num_fields = int(schema.num_dense), int(schema.num_fields)
        if self.num_dense < 0 or self.num_fields < 1:
            raise ConfigError(f"{type(self).__name__}: the schema needs num_dense >= 0 and num_fields >= 1, "
                              f"got num_dense={self.num_dense}, num_fields={self.num_fields}")
        self.prefix = prefix
        from paramshard.models.heads import LabelHead
        self.label_head = LabelHead.of_schema(schema)      # what the outputs mean (models/heads.py)
        self.tasks = self.label_head.outputs
        if self.tasks > 1 and not self.multi_task:
            raise ConfigError(f"{type(self).__name__} has no multi-task head (labels "
                              f"{', '.join(self.label_head.names)}): choose a model that has one "
                              f"(its class sets multi_task = True once its last layers give self.tasks outputs), "
                              f"or train one label at a time")
        # The factory is not kept: a lambda attribute would make the model unpicklable (torch.save).
        factory = embedding or default_embedding(table_optimizer, capacity)
        # One weight per feature id (per task): logistic regression.
        self.wide = factory(prefix + "wide", self.tasks)
        self.dim = dim
        if dim is not None:
            if not isinstance(dim, int) or dim < 1:
                raise ConfigError(f"{type(self).__name__}: dim must be a whole number >= 1, got {dim!r}")
            self.deep = factory(prefix + "deep", dim)    # one row per (field, value): ids are field-distinct

    def check(self, dense: torch.Tensor, ids: torch.Tensor, offsets, weights) -> int:
        """The batch size; ConfigError naming expected vs got on a wrong shape."""
        name, F, D = type(self).__name__, self.num_fields, self.num_dense
        if dense.dim() != 2 or dense.shape[1] != D:
            raise ConfigError(f"{name}: dense must be [B, {D}] (num_dense={D}), got {list(dense.shape)}")
        batch = dense.shape[0]
        if ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise ConfigError(f"{name}: ids must be int64 feature ids, got {ids.dtype}")
        if offsets is None:
            if ids.dim() != 2 or ids.shape[1] != F or ids.shape[0] != batch:
                raise ConfigError(f"{name}: ids must be [B, num_fields] = [{batch}, {F}] (B from dense), "
                                  f"got {list(ids.shape)}")
            return batch
        if ids.dim() != 1:
            raise ConfigError(f"{name}: with offsets, ids must be flat [N], got {list(ids.shape)}")
        if offsets.dim() != 1 or offsets.shape[0] != batch * F:
            raise ConfigError(f"{name}: offsets must be [B * num_fields] = [{batch * F}] "
                              f"(B={batch}, num_fields={F}), got {list(offsets.shape)}")
        if weights is not None and weights.shape != ids.shape:
            raise ConfigError(f"{name}: weights must be one per id, [{ids.shape[0]}], got {list(weights.shape)}")
        return batch

    def linear_logit(self, dense, ids, offsets, weights, batch: int) -> torch.Tensor:
        """[B] ([B, T] multi-task): sum of every field's wide weight + the dense linear term (with the bias)."""
        wide = lookup(self.wide, ids, offsets, weights, batch, self.num_fields)      # [B, F, T]
        if self.tasks == 1:
            return wide.sum(dim=(1, 2)) + self.dense_wide(dense).squeeze(1)
        return wide.sum(dim=1) + self.dense_wide(dense)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """A last layer's [B, tasks] output as the model returns it: [B] for one task, else as it
        is (a squeeze of [B, T] would be a no-op in torch but a failing Squeeze node in ONNX)."""
        return out.squeeze(1) if self.tasks == 1 else out

    def per_task(self, term):
        """A term of one value per row ([B]: an FM interaction) added to each of T logits."""
        return term.unsqueeze(1) if self.tasks > 1 and isinstance(term, torch.Tensor) else term

    def embed(self, ids, offsets, weights, batch: int) -> torch.Tensor:
        """[B, F, dim] deep field embeddings (a multi-valued field: the weighted sum of its bag)."""
        return lookup(self.deep, ids, offsets, weights, batch, self.num_fields)

    def extra_repr(self) -> str:
        dim = "" if self.dim is None else f", dim={self.dim}"
        prefix = f", prefix={self.prefix!r}" if self.prefix else ""
        tasks = f", tasks={self.tasks}" if self.tasks > 1 else ""
        return f"num_dense={self.num_dense}, num_fields={self.num_fields}{dim}{prefix}{tasks}"
