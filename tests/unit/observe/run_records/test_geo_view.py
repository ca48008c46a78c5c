"""The GEO reader (observe/run_records/geo_view.py) on a run directory written here by hand:
every figure checked against sums computed from the records themselves."""
from __future__ import annotations

import json

from paramshard.observe.run_records import geo_view
from paramshard.observe.run_records.run_data import load_run
from tests.unit.observe.geo_run import KS, T0, geo_run


def test_bytes_in_total_and_per_sample(tmp_path):
    run = geo_run(tmp_path / "run")
    total = sum(1000 * k + t for t, ks in KS.items() for k in ks)
    assert geo_view.has_geo(run) and geo_view.bytes_total(run) == total
    samples = sum(sum(ks) * 100 for ks in KS.values())     # each trainer's latest samples
    assert geo_view.samples_total(run) == samples
    assert geo_view.bytes_per_sample(run) == total / samples


def test_k_over_time_and_the_staleness_histogram(tmp_path):
    run = geo_run(tmp_path / "run")
    assert [k for _, _, k in geo_view.k_over_time(run)[0]] == KS[0]
    assert geo_view.k_over_time(run)[1][0] == (1.0, 4, 4)     # seconds since the first record (T0 + 10), step, k
    assert geo_view.staleness_histogram(run) == {4: 2, 8: 3, 16: 4, 32: 1}
    rows = {t.trainer: t for t in geo_view.per_trainer(run)}
    assert (rows[0].rounds, rows[0].steps, rows[0].first_k, rows[0].last_k, rows[0].max_k) == (5, 76, 4, 64, 32)
    assert abs(rows[1].wire_share - 0.5 / (0.5 + 0.52)) < 1e-12


def test_overlapped_sends_count_only_what_they_took_from_training(tmp_path):
    rows = {t.trainer: t for t in geo_view.per_trainer(geo_run(tmp_path / "run", blocked_s=0.02))}
    assert abs(rows[1].wire_share - 5 * 0.02 / (5 * 0.02 + 0.52)) < 1e-12


def test_bytes_at_each_validation_auc(tmp_path):
    """valid_auc logged at T0+25 and T0+45: the bytes of the rounds that ended by then."""
    run = geo_run(tmp_path / "run")
    name, points = geo_view.bytes_against_metric(run)
    by = lambda t: sum(1000 * k + tr for tr, ks in KS.items() for i, k in enumerate(ks) if T0 + 10 * (i + 1) + tr <= t)
    assert name == "valid_auc" and points == [(by(T0 + 25), 0.70), (by(T0 + 45), 0.74)]


def test_without_an_auc_the_loss_and_without_rounds_nothing(tmp_path):
    run = geo_run(tmp_path / "run", auc=False)
    name, points = geo_view.bytes_against_metric(run)
    assert name == "loss" and [v for _, v in points] == [0.6, 0.6, 0.5, 0.5]
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain/metrics.jsonl").write_text(json.dumps({"t": T0, "kind": "event", "event": "start"}) + "\n")
    plain = load_run(tmp_path / "plain")
    assert not geo_view.has_geo(plain) and geo_view.bytes_against_metric(plain) == (None, [])
    assert geo_view.bytes_per_sample(plain) is None and geo_view.staleness_histogram(plain) == {}
