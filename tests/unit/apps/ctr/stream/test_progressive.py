"""The progressive window's figures against scikit-learn on the same window (the oracle):
exact AUC (ties count half) and log loss over exactly the last W pairs, whatever the batch
sizes and however often the ring wrapped; the whole pass's count and log loss as running sums."""
import math

import numpy as np
import pytest
from sklearn.metrics import log_loss, roc_auc_score

from paramshard.apps.ctr.stream.progressive import ProgressiveWindow
from paramshard.errors import ConfigError


def stream(n, seed):
    g = np.random.default_rng(seed)
    labels = (g.random(n) < 0.3).astype(np.float64)
    # Rounded: many ties, which must count one half as in roc_auc_score.
    scores = np.clip(np.round(0.3 + 0.2 * (labels - 0.3) + g.normal(0, 0.2, n), 2), 0.01, 0.99)
    return scores, labels


@pytest.mark.parametrize("size,batches", [(50, [7, 13, 1, 49, 50, 51, 120, 3]), (1000, [10, 20, 30]),
                                          (64, [64, 64, 10, 200])])
def test_the_window_is_the_last_pairs_and_its_figures_are_sklearns(size, batches):
    scores, labels = stream(sum(batches), seed=size)
    w = ProgressiveWindow(size)
    at = 0
    for n in batches:
        w.add(scores[at:at + n], labels[at:at + n])
        at += n
        lo = max(0, at - size)
        s, y = w.window()
        np.testing.assert_array_equal(s, scores[lo:at])     # oldest first, exactly the last `size`
        np.testing.assert_array_equal(y, labels[lo:at])
        r = w.result()
        assert r["window_events"] == at - lo and r["events"] == at
        if 0 < y.sum() < y.size:
            assert r["auc"] == pytest.approx(roc_auc_score(labels[lo:at], scores[lo:at]), abs=1e-12)
        else:
            assert math.isnan(r["auc"])
        assert r["logloss"] == pytest.approx(log_loss(labels[lo:at], scores[lo:at], labels=[0, 1]), rel=1e-12)
        assert r["pass_logloss"] == pytest.approx(log_loss(labels[:at], scores[:at], labels=[0, 1]), rel=1e-12)
        assert r["positive_rate"] == labels[:at].mean()


def test_an_empty_window_says_nan_not_an_error():
    r = ProgressiveWindow(10).result()
    assert r["events"] == 0 and math.isnan(r["auc"]) and math.isnan(r["logloss"])


def test_refused_values():
    with pytest.raises(ConfigError, match="must be >= 1"):
        ProgressiveWindow(0)
    with pytest.raises(ConfigError, match="binary"):
        ProgressiveWindow(5).add([0.5], [2.0])
    with pytest.raises(ConfigError, match="2 labels but 1 scores"):
        ProgressiveWindow(5).add([0.5], [1.0, 0.0])
