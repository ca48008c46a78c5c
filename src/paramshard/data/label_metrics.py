"""Metrics of the labels beyond binary (schema label_kind; models/heads.py), seen in pieces:

- RegressionMetrics: MSE, RMSE and MAE of predicted values against the label, in the label's
  units (scikit-learn's mean_squared_error / mean_absolute_error, weighted by the rows'
  sample weights when given), and the label's own std over the rows ("label_std": an RMSE
  well below it is a model that learnt something; always predicting the mean scores it);
- MultiTaskMetrics: BinaryMetrics per task, under "tasks" by label name, and their means as
  "auc", "logloss" and "accuracy" (what --monitor picks epochs by: the mean over the tasks),
  so a multi-task run's figures read as a binary run's, with each task's beside them.

``metrics_for(kind, names)`` gives the one for a schema's label kind (BinaryMetrics for binary).
"""
from __future__ import annotations

import math

import numpy as np

from paramshard.data.metrics import BinaryMetrics, _weights
from paramshard.errors import ConfigError


class RegressionMetrics:
    def __init__(self):
        self.rows = 0
        self.weight = self.squared = self.absolute = self.y_sum = self.y2_sum = 0.0

    def update(self, labels, predictions, weights=None, groups=None) -> None:
        y = np.asarray(labels, np.float64).ravel()
        p = np.asarray(predictions, np.float64).ravel()
        if p.shape != y.shape:
            raise ConfigError(f"{y.size} labels but {p.size} predictions")
        w = _weights(weights, y.size)
        err = p - y
        self.squared += float((w * err * err).sum())
        self.absolute += float((w * np.abs(err)).sum())
        self.y_sum += float((w * y).sum())
        self.y2_sum += float((w * y * y).sum())
        self.weight += float(w.sum())
        self.rows += y.size

    def result(self) -> dict:
        total = self.weight
        if not total:
            return {"mse": math.nan, "rmse": math.nan, "mae": math.nan, "label_std": math.nan, "rows": self.rows}
        mse = self.squared / total
        mean = self.y_sum / total
        return {"mse": mse, "rmse": math.sqrt(mse), "mae": self.absolute / total,
                "label_std": math.sqrt(max(self.y2_sum / total - mean * mean, 0.0)), "rows": self.rows}


class MultiTaskMetrics:
    def __init__(self, names):
        self.names = list(names)
        self.per_task = [BinaryMetrics() for _ in self.names]

    @property
    def rows(self) -> int:
        return self.per_task[0].rows

    def update(self, labels, probs, weights=None, groups=None) -> None:
        y = np.asarray(labels).reshape(-1, len(self.names))
        p = np.asarray(probs, np.float64).reshape(-1, len(self.names))
        for t, metrics in enumerate(self.per_task):
            metrics.update(y[:, t], p[:, t], weights=weights, groups=groups)

    def result(self) -> dict:
        tasks = {name: m.result() for name, m in zip(self.names, self.per_task)}
        out: dict = {key: float(np.mean([t[key] for t in tasks.values()])) for key in ("auc", "logloss", "accuracy")}
        if all("gauc" in t for t in tasks.values()):
            out["gauc"] = float(np.mean([t["gauc"] for t in tasks.values()]))
        out["rows"] = self.rows
        out["tasks"] = tasks
        return out


def metrics_for(kind: str, names=()):
    """The metrics object for a label kind ("binary", "regression", "multitask")."""
    if kind == "regression":
        return RegressionMetrics()
    if kind == "multitask":
        return MultiTaskMetrics(names)
    return BinaryMetrics()
