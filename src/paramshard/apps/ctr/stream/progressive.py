"""Progressive validation ("predict then train") over a sliding window of events.

A model learning from a stream has no held-out set: every event is first scored by the model
as it stands, then trained on. Each (score, label) pair was predicted before the model saw the
event, so the figures over them estimate held-out performance without holding anything out
(Blum, Kalai and Langford, COLT 1999; McMahan et al., KDD 2013 "Ad click prediction", section 5.1).

``ProgressiveWindow`` keeps the last ``size`` pairs in a ring buffer and computes the window's
figures exactly when asked (every few seconds, not every batch): AUC by data/metrics.auc (ties
count half, what scikit-learn's roc_auc_score computes) and log loss, both over exactly the
window's events. A recomputation over 100k events costs about 10 ms of sort, so nothing
incremental (and approximate) is needed. Beside the window, the whole pass's event count, log
loss and positive count are kept exactly as running sums (a stream's AUC over all of it would
need every score kept).
"""
from __future__ import annotations

import math

import numpy as np

from paramshard.data.metrics import auc, logloss
from paramshard.errors import ConfigError

DEFAULT_WINDOW = 100_000
EPS = 1e-7          # data/metrics.logloss's clipping: the window's and the pass's log loss agree


class ProgressiveWindow:
    def __init__(self, size: int = DEFAULT_WINDOW):
        if size < 1:
            raise ConfigError(f"progressive window of {size} events: must be >= 1")
        self.size = size
        self._scores = np.empty(size, np.float64)
        self._labels = np.empty(size, np.float64)
        self._next = 0           # where the next pair goes
        self._filled = 0         # pairs in the window (size once it wrapped)
        self.events = 0          # every pair added (the whole pass)
        self.positives = 0
        self._loss_sum = 0.0     # the whole pass's summed log loss

    def add(self, scores, labels) -> None:
        """Pairs of one batch, scored before it trained; labels 0 or 1."""
        s = np.asarray(scores, np.float64).ravel()
        y = np.asarray(labels, np.float64).ravel()
        if s.shape != y.shape:
            raise ConfigError(f"{y.size} labels but {s.size} scores")
        if y.size and not np.isin(y, (0.0, 1.0)).all():
            raise ConfigError("progressive validation needs binary labels (0 or 1)")
        p = np.clip(s, EPS, 1.0 - EPS)
        self._loss_sum += float(-np.where(y == 1.0, np.log(p), np.log1p(-p)).sum())
        self.events += y.size
        self.positives += int(y.sum())
        if y.size >= self.size:          # only the batch's last `size` pairs stay
            s, y = s[-self.size:], y[-self.size:]
        start, n = self._next, y.size
        first = min(n, self.size - start)
        self._scores[start:start + first], self._labels[start:start + first] = s[:first], y[:first]
        self._scores[:n - first], self._labels[:n - first] = s[first:], y[first:]
        self._next = (start + n) % self.size
        self._filled = min(self.size, self._filled + n)

    def window(self) -> tuple[np.ndarray, np.ndarray]:
        """(scores, labels) of the window, oldest first."""
        if self._filled < self.size:
            return self._scores[:self._filled].copy(), self._labels[:self._filled].copy()
        order = np.r_[self._next:self.size, 0:self._next]
        return self._scores[order], self._labels[order]

    def result(self) -> dict:
        """The window's AUC and log loss (NaN while it holds one class only, or nothing), its
        event count, and the whole pass's events, log loss and positive rate."""
        s, y = self.window()
        return {"auc": auc(y, s) if y.size else math.nan,
                "logloss": logloss(y, s, EPS) if y.size else math.nan,
                "window_events": int(y.size),
                "events": self.events,
                "pass_logloss": self._loss_sum / self.events if self.events else math.nan,
                "positive_rate": self.positives / self.events if self.events else math.nan}


def text(figures: dict) -> str:
    """A log line's figures (the start: this process's, a resumed run's window starts empty)."""
    return (f"progressive AUC {figures['auc']:.4f} logloss {figures['logloss']:.4f} over the last "
            f"{figures['window_events']:,} events; {figures['events']:,} scored since the start "
            f"(logloss {figures['pass_logloss']:.4f})")
