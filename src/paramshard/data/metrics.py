"""Binary-classification metrics for CTR evaluation (numpy only)."""
from __future__ import annotations

import numpy as np

from paramshard.errors import ConfigError


def _binary_labels(labels) -> np.ndarray:
    y = np.asarray(labels).ravel()
    if y.size and not np.isin(y, (0, 1)).all():
        raise ConfigError("labels must all be 0 or 1")
    return y.astype(bool)


def auc(labels, scores) -> float:
    """Area under the ROC curve: the probability that a random positive scores
    above a random negative, ties counting one half (Mann-Whitney U from
    average ranks). NaN when the labels are all one class: it is undefined
    there, and a NaN in an eval log is easier to live with than an exception.
    """
    y = _binary_labels(labels)
    s = np.asarray(scores, np.float64).ravel()
    if s.shape != y.shape:
        raise ConfigError(f"{y.size} labels but {s.size} scores")
    pos = int(y.sum())
    neg = y.size - pos
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(s, kind="stable")
    sorted_s = s[order]
    # average 1-based rank of each run of equal scores
    run_start = np.flatnonzero(np.r_[True, sorted_s[1:] != sorted_s[:-1]])
    run_end = np.r_[run_start[1:], s.size]
    run_rank = (run_start + 1 + run_end) / 2.0
    ranks = np.empty(s.size)
    ranks[order] = np.repeat(run_rank, run_end - run_start)
    return float((ranks[y].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def logloss(labels, probs, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy; probabilities are clipped to [eps, 1-eps] so
    one confident mistake gives a large but finite loss."""
    y = _binary_labels(labels)
    p = np.clip(np.asarray(probs, np.float64).ravel(), eps, 1.0 - eps)
    if p.shape != y.shape:
        raise ConfigError(f"{y.size} labels but {p.size} probabilities")
    if y.size == 0:
        return float("nan")
    return float(-np.mean(np.where(y, np.log(p), np.log1p(-p))))


def auc_of_counts(pos: np.ndarray, neg: np.ndarray) -> float:
    """AUC from positive and negative counts per score level, in increasing score order:
    each positive beats the negatives below its level and ties half of those at it."""
    p, n = pos.sum(), neg.sum()
    if p == 0 or n == 0:
        return float("nan")
    neg_below = np.cumsum(neg) - neg
    return float((pos * (neg_below + 0.5 * neg)).sum() / (p * n))


class StreamingAUC:
    """AUC of probabilities seen in pieces, in O(bins) memory.

    Scores are bucketed into ``bins`` equal-width bins of [0, 1]; pairs in the
    same bin count as ties, so the result is within about 1/bins of the exact
    AUC (well within 1e-4 at the default). Used where rows do not fit in memory.
    """

    def __init__(self, bins: int = 1 << 20):
        self.bins = bins
        self.pos = np.zeros(bins, np.int64)
        self.neg = np.zeros(bins, np.int64)

    def update(self, labels, probs) -> None:
        y = _binary_labels(labels)
        b = np.clip((np.asarray(probs, np.float64).ravel() * self.bins).astype(np.int64), 0, self.bins - 1)
        self.pos += np.bincount(b[y], minlength=self.bins)
        self.neg += np.bincount(b[~y], minlength=self.bins)

    def value(self) -> float:
        return auc_of_counts(self.pos, self.neg)


class ExactAUC:
    """AUC of scores seen in pieces, exact: it keeps one (positives, negatives) count
    per distinct score, so memory grows with the distinct scores (at most the rows;
    float32 probabilities of a trained model repeat a lot), never with bins."""

    def __init__(self):
        self.scores = np.empty(0, np.float64)
        self.pos = np.empty(0, np.int64)
        self.neg = np.empty(0, np.int64)

    def update(self, labels, scores) -> None:
        y = _binary_labels(labels)
        s = np.asarray(scores, np.float64).ravel()
        if s.shape != y.shape:
            raise ConfigError(f"{y.size} labels but {s.size} scores")
        merged, where = np.unique(np.concatenate([self.scores, s]), return_inverse=True)
        pos = np.bincount(where[len(self.scores):][y], minlength=len(merged))
        neg = np.bincount(where[len(self.scores):][~y], minlength=len(merged))
        old = where[:len(self.scores)]
        pos[old] += self.pos
        neg[old] += self.neg
        self.scores, self.pos, self.neg = merged, pos, neg

    def value(self) -> float:
        """Equal to ``auc`` over every score seen (ties count one half)."""
        return auc_of_counts(self.pos, self.neg)


class BinaryMetrics:
    """AUC (exact), log loss and accuracy at 0.5 of probabilities seen in pieces."""

    def __init__(self, eps: float = 1e-7):
        self.auc = ExactAUC()
        self.eps = eps
        self.rows = self.correct = self.positives = 0
        self.loss_sum = 0.0

    def update(self, labels, probs) -> None:
        y = _binary_labels(labels)
        p = np.asarray(probs, np.float64).ravel()
        self.auc.update(y, p)
        q = np.clip(p, self.eps, 1.0 - self.eps)
        self.loss_sum += float(-np.where(y, np.log(q), np.log1p(-q)).sum())
        self.correct += int(((p >= 0.5) == y).sum())
        self.positives += int(y.sum())
        self.rows += y.size

    def result(self) -> dict:
        rows = self.rows
        return {"auc": self.auc.value(), "logloss": self.loss_sum / rows if rows else float("nan"),
                "accuracy": self.correct / rows if rows else float("nan"), "rows": rows,
                "positive_rate": self.positives / rows if rows else float("nan")}
