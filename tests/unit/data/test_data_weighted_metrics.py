"""Sample-weighted metrics and GAUC (issue 32) against scikit-learn and a per-group loop."""
import math

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, log_loss, roc_auc_score

from paramshard.data.metrics import BinaryMetrics, ExactAUC, grouped_auc, weighted_logloss
from paramshard.errors import ConfigError


def sample(seed: int, n: int = 3000, groups: int = 60):
    rng = np.random.default_rng(seed)
    g = rng.integers(0, groups, n) * 7919 - 10**12            # group keys as the reader makes them: any int64
    y = rng.integers(0, 2, n)
    p = np.round(np.clip(rng.random(n) * 0.6 + 0.3 * y, 0.01, 0.99), 2)     # rounded: ties
    w = rng.choice([0.0, 0.5, 1.0, 3.0], n)
    return g, y, p, w


def gauc_by_loop(g, y, p, w=None):
    """The literature's GAUC: per group with both classes, sklearn's AUC, averaged by the group's rows
    (its total weight when weighted)."""
    w = np.ones(len(y)) if w is None else w
    total = num = 0.0
    for key in np.unique(g):
        m = g == key
        if len(set(y[m][w[m] > 0])) < 2:
            continue
        num += roc_auc_score(y[m], p[m], sample_weight=w[m]) * w[m].sum()
        total += w[m].sum()
    return num / total


@pytest.mark.parametrize("seed", range(3))
def test_weighted_metrics_in_pieces_equal_sklearn_with_sample_weight(seed):
    g, y, p, w = sample(seed)
    m = BinaryMetrics()
    for lo in range(0, len(y), 701):
        m.update(y[lo:lo + 701], p[lo:lo + 701], weights=w[lo:lo + 701])
    r = m.result()
    assert r["auc"] == pytest.approx(roc_auc_score(y, p, sample_weight=w), abs=1e-12)
    assert r["logloss"] == pytest.approx(log_loss(y, p, sample_weight=w), rel=1e-12)
    assert weighted_logloss(y, p, w) == pytest.approx(log_loss(y, p, sample_weight=w), rel=1e-12)
    assert r["accuracy"] == pytest.approx(accuracy_score(y, p >= 0.5, sample_weight=w), rel=1e-12)
    assert r["positive_rate"] == pytest.approx(np.average(y, weights=w), rel=1e-12)
    assert r["rows"] == len(y) and "gauc" not in r


def test_weights_of_one_give_the_unweighted_figures_exactly():
    _, y, p, _ = sample(5)
    plain, ones = BinaryMetrics(), BinaryMetrics()
    plain.update(y, p)
    ones.update(y, p, weights=np.ones(len(y)))
    assert plain.result() == ones.result()
    assert plain.result()["auc"] == pytest.approx(roc_auc_score(y, p), abs=1e-12)


def test_an_integer_weight_counts_as_that_many_copies_of_the_row():
    _, y, p, _ = sample(6, n=400)
    k = np.random.default_rng(6).integers(0, 4, len(y))
    weighted, copied = ExactAUC(), ExactAUC()
    weighted.update(y, p, k)
    copied.update(np.repeat(y, k), np.repeat(p, k))
    assert weighted.value() == pytest.approx(copied.value(), abs=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_gauc_equals_the_per_group_loop_of_sklearn(seed):
    g, y, p, w = sample(seed)
    # A group of one class (skipped) and a one-row group (skipped).
    g[:40], y[:40] = 123, 1
    g[40] = 456
    value, counted = grouped_auc(g, y, p)
    assert value == pytest.approx(gauc_by_loop(g, y, p), abs=1e-12)
    assert counted == sum(len(set(y[g == key])) == 2 for key in np.unique(g))
    assert grouped_auc(g, y, p, w)[0] == pytest.approx(gauc_by_loop(g, y, p, w), abs=1e-12)
    m = BinaryMetrics()
    for lo in range(0, len(y), 999):
        m.update(y[lo:lo + 999], p[lo:lo + 999], groups=g[lo:lo + 999])
    r = m.result()
    assert r["gauc"] == pytest.approx(value, abs=1e-12) and r["groups"] == counted


def test_gauc_of_one_group_is_the_auc_and_of_no_usable_group_is_nan():
    _, y, p, _ = sample(9, n=500)
    assert grouped_auc(np.zeros(len(y), np.int64), y, p)[0] == pytest.approx(roc_auc_score(y, p), abs=1e-12)
    value, counted = grouped_auc(np.arange(len(y)), y, p)        # every row its own group
    assert math.isnan(value) and counted == 0


def test_bad_weights_are_refused():
    with pytest.raises(ConfigError, match="sample weights"):
        BinaryMetrics().update([0, 1], [0.2, 0.7], weights=[1.0, -1.0])
    with pytest.raises(ConfigError, match="2 labels but 3 sample weights"):
        ExactAUC().update([0, 1], [0.2, 0.7], [1, 1, 1])
