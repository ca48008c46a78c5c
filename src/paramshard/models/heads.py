"""What a CTR model's outputs mean, from its schema's labels (``label_kind``): how they become
scores and what loss trains them. One place for training, evaluation, `paramshard predict`
and the exported TorchScript/ONNX module, so they never disagree.

- "binary": the model gives one logit per row, [B]; the score is sigmoid(logit), the loss
  binary cross-entropy;
- "regression": one raw value per row, [B], on the standardised label's scale: the score is
  ``raw * std + mean`` in the label's units (mean and std from ``schema fit``, label.stats;
  0 and 1 without them), the loss the mean squared error against ``(y - mean) / std``. A
  linear output, no sigmoid; training on the standardised label keeps the loss near 1 at the
  start whatever the label's units (a price in thousands would otherwise need other learning
  rates). The MSE in the label's units is that loss times std^2;
- "multitask": T logits per row, [B, T], one per label (``schema.tasks``, in order) over the
  shared body (the model's last layers have T outputs); scores are the sigmoid of each, the
  loss the mean over the T tasks of each task's binary cross-entropy.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F


@dataclasses.dataclass(frozen=True)
class LabelHead:
    kind: str = "binary"
    names: tuple = ("label",)           # the label columns, in output order
    mean: float = 0.0                   # regression: the label's mean and std (label.stats)
    std: float = 1.0

    @classmethod
    def of_schema(cls, schema) -> "LabelHead":
        """From a Schema; a stand-in without labels (num_dense/num_fields only) is binary."""
        kind = getattr(schema, "label_kind", "binary")
        if not hasattr(schema, "tasks"):
            return cls()
        names = tuple(schema.label_names)
        stats = (schema.label.stats or {}) if kind == "regression" else {}
        std = float(stats.get("std") or 1.0)
        return cls(kind, names, float(stats.get("mean", 0.0)), std if std > 0 else 1.0)

    @property
    def outputs(self) -> int:
        """Outputs per row of the model's last layer: T for multi-task, else 1."""
        return len(self.names) if self.kind == "multitask" else 1

    def scores(self, raw: torch.Tensor) -> torch.Tensor:
        """The model's output as scores: probabilities [B] / [B, T], or the predicted value [B]."""
        if self.kind == "regression":
            return raw.reshape(-1) * self.std + self.mean
        if self.kind == "multitask":
            return torch.sigmoid(raw.reshape(-1, self.outputs))
        return torch.sigmoid(raw.reshape(-1))

    def loss(self, raw: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """The training loss of a batch (``weight``: each row's, --weight), averaged over its rows."""
        if self.kind == "regression":
            target = (labels - self.mean) / self.std
            per_row = (raw.reshape(-1) - target) ** 2
            return (per_row * weight).mean() if weight is not None else per_row.mean()
        if self.kind == "multitask":
            per = F.binary_cross_entropy_with_logits(raw.reshape(labels.shape), labels, reduction="none").mean(1)
            return (per * weight).mean() if weight is not None else per.mean()
        return F.binary_cross_entropy_with_logits(raw, labels, weight=weight)


def head_of(model) -> LabelHead:
    """The model's LabelHead (a CTR model built from a schema has one), else binary."""
    head = getattr(model, "label_head", None)
    return head if isinstance(head, LabelHead) else LabelHead()
