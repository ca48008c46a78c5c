"""evaluate() and predict(): a model over a reader's batches, in eval mode, no gradients.

In eval mode a SparseEmbedding creates nothing on the servers (an id never
seen in training reads its initial row), so evaluating never changes the
model. Batches are TabularBatch (the schema-driven reader: the model is
called as ``model(dense, ids, offsets, weights)``), CriteoBatch
(``model(dense, ids)``), or anything with ``forward=`` and ``labels=``.

In a cluster, call ``trainer.pull()`` first (async: other trainers' latest
pushes) and, when only one trainer evaluates, ``paramshard.barrier()`` so the
others have finished the epoch's pushes.
"""
from __future__ import annotations

import numpy as np
import torch

from paramshard.data.label_metrics import metrics_for
from paramshard.errors import ConfigError
from paramshard.models.heads import head_of


def default_forward(model, batch) -> torch.Tensor:
    from paramshard.data.features.batch import TabularBatch
    from paramshard.data.readers.criteo import CriteoBatch
    if isinstance(batch, TabularBatch):
        t = batch.torch()
        return model(t["dense"], t["ids"], t["offsets"], t["weights"])
    if isinstance(batch, CriteoBatch):
        return model(torch.from_numpy(batch.dense), torch.from_numpy(batch.sparse_ids.view(np.int64)))
    raise ConfigError(f"evaluate/predict: no default way to feed a {type(batch).__name__} to the model; "
                      f"pass forward=lambda model, batch: logits and labels=lambda batch: array")


def _probabilities(model, batches, forward):
    """(batch, scores): models/heads.py turns the outputs into scores (probabilities, or a
    regression's predicted values in the label's units; [B, T] for T multi-task labels)."""
    forward = forward or default_forward
    head = head_of(model)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for batch in batches:
                yield batch, head.scores(forward(model, batch)).double().numpy()
    finally:
        model.train(was_training)


def predict(model, batches, forward=None) -> np.ndarray:
    """Scores for every row, in order: probabilities (sigmoid of the model's logits), [N, T] for
    a multi-task model; a regression model's predicted values (models/heads.py)."""
    parts = [p for _, p in _probabilities(model, batches, forward)]
    return np.concatenate(parts) if parts else np.empty(0)


def evaluate(model, batches, forward=None, labels=None) -> dict:
    """{"auc", "logloss", "accuracy", "rows", "positive_rate"} over every batch; AUC is exact (ties count half).
    Batches that carry side columns (TabularBatch.extras: a reader's ``side=``) are weighted by
    their "weight" and add "gauc" and "groups" by their "group" (data/metrics.py).
    A regression model: {"mse", "rmse", "mae", "label_std", "rows"}; a multi-task one: the means
    over its tasks and each task's under "tasks" (data/label_metrics.py)."""
    head = head_of(model)
    metrics = metrics_for(head.kind, head.names)
    for batch, probs in _probabilities(model, batches, forward):
        extras = getattr(batch, "extras", None) or {}
        metrics.update(labels(batch) if labels else batch.labels, probs, weights=extras.get("weight"),
                       groups=extras.get("group"))
    if metrics.rows == 0:
        raise ConfigError("evaluate: the reader gave no rows")
    return metrics.result()
