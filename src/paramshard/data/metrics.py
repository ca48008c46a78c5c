"""Binary-classification metrics for CTR evaluation (numpy only).

Sample weights (the CTR app's ``--weight COL``): a row of weight w counts as w rows, in every
metric: log loss and accuracy are weighted means, AUC counts a (positive, negative) pair as
the product of their weights (what scikit-learn's ``roc_auc_score(sample_weight=)`` computes).
GAUC (``--group-by COL``, grouped_auc): the AUC of each group's rows (e.g. one user's), averaged
with the groups' weights (their rows, or their total sample weight); a group whose rows are all
one class has no AUC and is left out, as in the literature (Zhou et al., DIN, KDD 2018).
"""
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


def _weights(weights, n: int) -> np.ndarray:
    """The rows' sample weights as float64 (1 each when None); a negative or non-finite one is
    an error (the readers refuse them first, naming the line)."""
    if weights is None:
        return np.ones(n, np.float64)
    w = np.asarray(weights, np.float64).ravel()
    if w.size != n:
        raise ConfigError(f"{n} labels but {w.size} sample weights")
    if w.size and not (np.isfinite(w).all() and (w >= 0).all()):
        raise ConfigError("sample weights must be finite and >= 0")
    return w


def weighted_logloss(labels, probs, weights=None, eps: float = 1e-7) -> float:
    """Log loss with each row's loss weighted: sum(w * loss) / sum(w) (scikit-learn's
    ``log_loss(sample_weight=)``); ``logloss`` when weights is None."""
    y = _binary_labels(labels)
    p = np.clip(np.asarray(probs, np.float64).ravel(), eps, 1.0 - eps)
    if p.shape != y.shape:
        raise ConfigError(f"{y.size} labels but {p.size} probabilities")
    w = _weights(weights, y.size)
    total = w.sum()
    return float(-(w * np.where(y, np.log(p), np.log1p(-p))).sum() / total) if total > 0 else float("nan")


def grouped_auc(groups, labels, scores, weights=None) -> tuple[float, int]:
    """(GAUC, groups counted): each group's AUC (weighted by ``weights`` if given), averaged
    with the group's total weight (its number of rows without weights); groups whose rows
    are all one class (or whose positives or negatives weigh 0) are skipped. NaN, 0 when no
    group has both classes. One sort by (group, score), no loop over the groups."""
    y = _binary_labels(labels)
    s = np.asarray(scores, np.float64).ravel()
    g = np.asarray(groups).ravel()
    if s.shape != y.shape or g.shape != y.shape:
        raise ConfigError(f"{y.size} labels, {s.size} scores and {g.size} groups: one each per row")
    w = _weights(weights, y.size)
    if y.size == 0:
        return float("nan"), 0
    order = np.lexsort((s, g))
    g, s, y, w = g[order], s[order], y[order], w[order]
    new_group = np.r_[True, g[1:] != g[:-1]]
    new_run = new_group | np.r_[True, s[1:] != s[:-1]]      # a run: equal scores within a group
    run = np.cumsum(new_run) - 1
    run_pos = np.bincount(run, weights=w * y)
    run_neg = np.bincount(run, weights=w * ~y)
    run_group = (np.cumsum(new_group) - 1)[np.flatnonzero(new_run)]
    neg_before = np.cumsum(run_neg) - run_neg                # over all runs before this one
    first_run = np.flatnonzero(np.r_[True, run_group[1:] != run_group[:-1]])
    neg_below = neg_before - neg_before[first_run][run_group]   # within the run's group only
    wins = np.bincount(run_group, weights=run_pos * (neg_below + 0.5 * run_neg))
    pos, neg = np.bincount(run_group, weights=run_pos), np.bincount(run_group, weights=run_neg)
    size = pos + neg
    both = (pos > 0) & (neg > 0)
    if not both.any():
        return float("nan"), 0
    per_group = wins[both] / (pos[both] * neg[both])
    return float((per_group * size[both]).sum() / size[both].sum()), int(both.sum())


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
    float32 probabilities of a trained model repeat a lot), never with bins. With
    ``weights`` the counts are sums of the rows' weights (a weighted AUC)."""

    def __init__(self):
        self.scores = np.empty(0, np.float64)
        self.pos = np.empty(0, np.float64)
        self.neg = np.empty(0, np.float64)

    def update(self, labels, scores, weights=None) -> None:
        y = _binary_labels(labels)
        s = np.asarray(scores, np.float64).ravel()
        if s.shape != y.shape:
            raise ConfigError(f"{y.size} labels but {s.size} scores")
        w = _weights(weights, y.size)
        merged, where = np.unique(np.concatenate([self.scores, s]), return_inverse=True)
        new = where[len(self.scores):]
        # float64 even when no row of a class came (bincount of nothing is int64)
        pos = np.bincount(new[y], weights=w[y], minlength=len(merged)).astype(np.float64, copy=False)
        neg = np.bincount(new[~y], weights=w[~y], minlength=len(merged)).astype(np.float64, copy=False)
        old = where[:len(self.scores)]
        pos[old] += self.pos
        neg[old] += self.neg
        self.scores, self.pos, self.neg = merged, pos, neg

    def value(self) -> float:
        """Equal to ``auc`` over every score seen (ties count one half)."""
        return auc_of_counts(self.pos, self.neg)


class BinaryMetrics:
    """AUC (exact), log loss and accuracy at 0.5 of probabilities seen in pieces; weighted
    by the rows' sample weights when given, and GAUC when the rows' groups are given (the
    groups, labels, scores and weights are then kept until ``result``: one entry per row)."""

    def __init__(self, eps: float = 1e-7):
        self.auc = ExactAUC()
        self.eps = eps
        self.rows = 0
        self.correct = self.positives = self.weight = self.loss_sum = 0.0
        self.grouped: list[tuple] = []

    def update(self, labels, probs, weights=None, groups=None) -> None:
        y = _binary_labels(labels)
        p = np.asarray(probs, np.float64).ravel()
        w = _weights(weights, y.size)
        self.auc.update(y, p, w)
        q = np.clip(p, self.eps, 1.0 - self.eps)
        # Unweighted, w is 1.0 everywhere: the sums are the counts, exactly.
        self.loss_sum += float(-(w * np.where(y, np.log(q), np.log1p(-q))).sum())
        self.correct += float(w[(p >= 0.5) == y].sum())
        self.positives += float(w[y].sum())
        self.weight += float(w.sum())
        self.rows += y.size
        if groups is not None:
            self.grouped.append((np.asarray(groups).ravel(), y, p, w))

    def result(self) -> dict:
        total = self.weight
        out = {"auc": self.auc.value(), "logloss": self.loss_sum / total if total else float("nan"),
               "accuracy": self.correct / total if total else float("nan"), "rows": self.rows,
               "positive_rate": self.positives / total if total else float("nan")}
        if self.grouped:
            g, y, p, w = (np.concatenate(part) for part in zip(*self.grouped))
            out["gauc"], out["groups"] = grouped_auc(g, y, p, w)
        return out
