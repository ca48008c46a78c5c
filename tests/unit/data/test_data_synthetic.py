"""generate_criteo: deterministic, valid, with the click rate and ceiling it promises."""
import math

import numpy as np
import pytest

from paramshard.data import CriteoBatch, CriteoReader, auc, generate_criteo, logloss
from paramshard.data.readers.criteo import MISSING
from paramshard.data.synthetic import DEFAULT_VOCAB_SIZES, HiddenModel

ROWS = 20000


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    path = tmp_path_factory.mktemp("syn") / "train.txt"
    report = generate_criteo(path, ROWS, seed=3)
    reader = CriteoReader(path, 8192)
    batch = CriteoBatch.concat(list(reader))
    assert reader.bad_lines == 0
    return path, report, batch


def test_writes_valid_rows_with_promised_click_rate_and_ceiling(generated):
    _, report, batch = generated
    assert report.rows == len(batch) == ROWS
    assert report.clicks == int(batch.labels.sum())
    assert 0.23 <= report.click_rate <= 0.27
    assert 0.75 <= report.hidden_auc <= 0.85


def test_reported_auc_is_the_hidden_models_auc_on_the_rows(generated):
    """Re-derive the hidden model's probabilities from the parsed file: exact AUC and
    log loss must equal what the generator reported while streaming."""
    _, report, batch = generated
    probs = HiddenModel(seed=3).probabilities(batch)
    assert auc(batch.labels, probs) == pytest.approx(report.hidden_auc, abs=1e-4)
    assert logloss(batch.labels, probs) == pytest.approx(report.hidden_logloss, rel=1e-4)


@pytest.mark.slow_unit(reason="writes the synthetic data set several times over")
def test_deterministic_per_seed_and_prefix_stable(tmp_path):
    a = generate_criteo(tmp_path / "a", 500, seed=1).path.read_bytes()
    assert generate_criteo(tmp_path / "b", 500, seed=1).path.read_bytes() == a
    assert generate_criteo(tmp_path / "c", 500, seed=2).path.read_bytes() != a
    # a row never depends on how many rows follow it
    longer = generate_criteo(tmp_path / "d", 40000, seed=1).path.read_bytes()
    assert longer.startswith(a)


def test_values_are_zipf_distributed_and_distinct_per_field(generated):
    _, _, batch = generated
    model = HiddenModel(seed=3)
    for f, vocab in enumerate(DEFAULT_VOCAB_SIZES):
        assert len(np.unique(model.values[f])) == vocab and MISSING not in model.values[f]
    # field 0: 1000 values, P(most common) = 1 / sum r**-1.2, no missing values
    top = 1 / np.sum(np.arange(1, 1001) ** -1.2)
    _, counts = np.unique(batch.sparse_ids[:, 0], return_counts=True)
    assert counts.max() / ROWS == pytest.approx(top, abs=0.015)
    # field 22 is missing 70% of the time
    assert np.mean(batch.sparse_ids[:, 22] == ((22 << 32) | MISSING)) == pytest.approx(0.7, abs=0.02)


def test_signal_is_learnable(generated):
    """Logistic regression on the ids (numpy gradient descent) trained on 3/4 of
    the rows must beat 0.5 clearly on the rest, and cannot beat the ceiling."""
    _, report, batch = generated
    uniq, idx = np.unique(batch.sparse_ids, return_inverse=True)
    idx = idx.reshape(batch.sparse_ids.shape)
    n = ROWS * 3 // 4
    w, bias = np.zeros(len(uniq)), 0.0
    for _ in range(100):
        p = 1 / (1 + np.exp(-(w[idx[:n]].sum(1) + bias)))
        g = (p - batch.labels[:n]) / n
        w -= 13.0 * np.bincount(idx[:n].ravel(), np.repeat(g, 26), minlength=len(uniq))
        bias -= 0.5 * g.sum()
    test_auc = auc(batch.labels[n:], w[idx[n:]].sum(1))
    assert 0.62 < test_auc < report.hidden_auc


def test_zero_rows_and_bad_arguments(tmp_path):
    report = generate_criteo(tmp_path / "empty.txt", 0)
    assert report.path.read_bytes() == b"" and math.isnan(report.hidden_auc)
    with pytest.raises(ValueError, match="rows=-1"):
        generate_criteo(tmp_path / "x", -1)
    with pytest.raises(ValueError, match="vocab_sizes"):
        generate_criteo(tmp_path / "x", 1, vocab_sizes=(10,) * 3)
