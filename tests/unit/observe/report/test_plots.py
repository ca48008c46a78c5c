"""observe/report/plots.py: what a person sees in `paramshard report` (the figures are inspected
before they are saved, not the PNG bytes)."""
import pytest

from paramshard.observe.report import plots
from paramshard.observe.run_records.run_data import logged_series


@pytest.fixture
def figures(monkeypatch):
    drawn = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(fig))
    return drawn


def _lines(fig, title):
    ax = next(ax for ax in fig.axes if ax.get_title() == title)
    return [(list(line.get_xdata()), list(line.get_ydata()), line.get_marker()) for line in ax.get_lines()]


def test_a_one_epoch_run_shows_its_single_auc_as_a_marker(figures, tmp_path):
    trainers = {0: [{"t": 1.0, "step": 50, "loss": 0.4, "samples_per_s": 10.0, "metrics": {"test_auc": 0.71},
                     "logged": [{"t": 1.0, "step": 50, "epoch": 1, "values": {"test_auc": 0.71}}]}]}
    assert plots.plot_loss(trainers, tmp_path / "loss.png") is None
    assert plots.plot_throughput(trainers, 0.0, tmp_path / "t.png") is None
    [(xs, ys, marker)] = _lines(figures[0], "test_auc")
    assert (xs, ys) == ([50], [0.71]) and marker not in ("None", "", None)
    [(_, _, marker)] = _lines(figures[0], "loss")
    assert marker not in ("None", "", None)
    [(_, _, marker)] = _lines(figures[1], "")
    assert marker not in ("None", "", None)


def test_the_auc_panel_has_every_logged_value_at_its_step(figures, tmp_path):
    # two records; the second holds three epochs' AUCs (sampled records kept only the last)
    records = [{"t": 1.0, "step": 10, "loss": 0.5, "metrics": {"auc": 0.6},
                "logged": [{"step": 10, "epoch": 1, "values": {"auc": 0.6}}]},
               {"t": 2.0, "step": 40, "loss": 0.4, "metrics": {"auc": 0.9},
                "logged": [{"step": 20, "epoch": 2, "values": {"auc": 0.7}},
                           {"step": 30, "epoch": 3, "values": {"auc": 0.8}},
                           {"step": 40, "epoch": 4, "values": {"auc": 0.9, "loss": 0.4}}]}]
    assert logged_series(records)["auc"] == [(10, 1, 0.6), (20, 2, 0.7), (30, 3, 0.8), (40, 4, 0.9)]
    plots.plot_loss({0: records}, tmp_path / "loss.png")
    [(xs, ys, _)] = _lines(figures[0], "auc")
    assert (xs, ys) == ([10, 20, 30, 40], [0.6, 0.7, 0.8, 0.9])
    assert [ax.get_title() for ax in figures[0].axes if ax.get_visible()] == ["loss", "auc"]


def test_records_from_before_logged_calls_plot_their_latest_metrics():
    old = [{"step": 5, "epoch": 1, "metrics": {"auc": 0.6}}, {"step": 9, "epoch": 2, "metrics": {"auc": 0.7}}]
    assert logged_series(old) == {"auc": [(5, 1, 0.6), (9, 2, 0.7)]}


def test_requests_plot_has_no_negative_rate(figures, tmp_path):
    servers = {0: [{"t": 1.0, "requests_per_s": 100.0}, {"t": 3.0, "requests_per_s": -450.0},
                   {"t": 5.0, "requests_per_s": 80.0}]}
    plots.plot_requests(servers, 0.0, tmp_path / "r.png")
    [(xs, ys, _)] = _lines(figures[0], "")
    assert (xs, ys) == ([1.0, 5.0], [100.0, 80.0])
