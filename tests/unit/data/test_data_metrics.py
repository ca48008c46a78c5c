"""auc / logloss against brute-force definitions."""
import math

import numpy as np
import pytest

from paramshard.data import auc, logloss
from paramshard.data.metrics import StreamingAUC
from paramshard.errors import ConfigError


def pairwise_auc(labels, scores):
    """P(score of a positive > score of a negative), ties counting 1/2, over all pairs."""
    pos = [s for y, s in zip(labels, scores) if y == 1]
    neg = [s for y, s in zip(labels, scores) if y == 0]
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", range(6))
def test_auc_equals_pairwise_oracle_with_ties(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 300))
    labels = rng.integers(0, 2, n)
    labels[:2] = [0, 1]
    scores = rng.integers(0, [3, 10, 1000][seed % 3], n).astype(float)  # many ties, some, few
    assert auc(labels, scores) == pytest.approx(pairwise_auc(labels, scores), abs=1e-12)


def test_auc_edge_cases():
    assert auc([0, 0, 1, 1], [0.1, 0.2, 0.3, 0.4]) == 1.0
    assert auc([1, 1, 0, 0], [0.1, 0.2, 0.3, 0.4]) == 0.0
    assert auc([0, 1, 0, 1], [0.5] * 4) == 0.5
    assert auc(np.array([True, False]), [0.2, 0.1]) == 1.0
    assert math.isnan(auc([1, 1], [0.1, 0.2]))
    with pytest.raises(ConfigError, match="0 or 1"):
        auc([0, 2], [0.1, 0.2])
    with pytest.raises(ConfigError, match="2 labels but 3 scores"):
        auc([0, 1], [0.1, 0.2, 0.3])


def test_logloss_equals_definition():
    y = np.array([1, 0, 1, 0, 1])
    p = np.array([0.9, 0.2, 0.5, 0.7, 0.01])
    expected = -np.mean([math.log(0.9), math.log(0.8), math.log(0.5), math.log(0.3), math.log(0.01)])
    assert logloss(y, p) == pytest.approx(expected, rel=1e-12)
    assert math.isfinite(logloss([1, 0], [0.0, 1.0]))  # clipped, not inf
    assert logloss([1, 0], [0.0, 1.0]) == pytest.approx(-math.log(1e-7), rel=1e-6)


def test_streaming_auc_matches_exact_in_pieces():
    rng = np.random.default_rng(0)
    p = rng.random(20000)
    y = (rng.random(20000) < p).astype(int)
    meter = StreamingAUC()
    for lo in range(0, len(p), 3000):
        meter.update(y[lo:lo + 3000], p[lo:lo + 3000])
    assert meter.value() == pytest.approx(auc(y, p), abs=1e-4)
    assert math.isnan(StreamingAUC().value())


def test_exact_auc_in_pieces_equals_auc_of_everything_with_ties():
    from paramshard.data.metrics import BinaryMetrics, ExactAUC, auc, logloss
    from sklearn.metrics import roc_auc_score
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 5000)
    p = np.round(rng.random(5000) * 0.5 + 0.4 * y, 2)      # rounded: many ties
    meter, both = ExactAUC(), BinaryMetrics()
    for start in range(0, 5000, 777):
        meter.update(y[start:start + 777], p[start:start + 777])
        both.update(y[start:start + 777], p[start:start + 777])
    assert meter.value() == pytest.approx(auc(y, p), abs=1e-12) == pytest.approx(roc_auc_score(y, p), abs=1e-12)
    r = both.result()
    assert r["auc"] == pytest.approx(roc_auc_score(y, p), abs=1e-12)
    assert r["logloss"] == pytest.approx(logloss(y, p), rel=1e-9)
    assert r["accuracy"] == pytest.approx(((p >= 0.5) == y).mean()) and r["rows"] == 5000
    assert math.isnan(ExactAUC().value())


def test_evaluate_and_predict_run_the_model_in_eval_mode_without_gradients():
    import torch
    from sklearn.metrics import log_loss, roc_auc_score
    from paramshard.data.features.batch import TabularBatch
    from paramshard.inference.evaluation import evaluate, predict
    rng = np.random.default_rng(0)
    batches = [TabularBatch(rng.integers(0, 2, 100).astype(np.float32), rng.normal(size=(100, 3)).astype(np.float32),
                            rng.integers(0, 10, (100, 2)), 2) for _ in range(3)]

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 1)
            self.seen_training = []

        def forward(self, dense, ids, offsets=None, weights=None):
            self.seen_training.append((self.training, torch.is_grad_enabled()))
            return self.lin(dense).squeeze(1) + ids.sum(1) * 0.01

    model = Model()
    probs = predict(model, batches)
    labels = np.concatenate([b.labels for b in batches])
    result = evaluate(model, batches)
    assert result["auc"] == pytest.approx(roc_auc_score(labels, probs), abs=1e-12)
    assert result["logloss"] == pytest.approx(log_loss(labels, probs), rel=1e-6)
    assert model.training and set(model.seen_training) == {(False, False)}
    with pytest.raises(Exception, match="no default way"):
        evaluate(model, [object()])
