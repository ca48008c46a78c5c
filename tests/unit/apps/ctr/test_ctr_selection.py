"""The CTR app's model selection: best epoch, decay on a plateau, early stop with patience."""
import pytest

from paramshard.apps.ctr.selection import Decision, Selection
from paramshard.errors import ConfigError


def test_an_improving_run_keeps_the_last_epoch_and_never_decays():
    d = Selection("auc", patience=2).decide([0.70, 0.72, 0.75])
    assert d == Decision(best_epoch=2, improved=True, decay=False, stop=False)


def test_a_plateau_decays_once_then_stops_after_patience_epochs():
    s = Selection("auc", patience=2, decay=0.1)
    assert s.decide([0.70, 0.75, 0.74]) == Decision(1, improved=False, decay=True, stop=False)
    assert s.decide([0.70, 0.75, 0.74, 0.749]) == Decision(1, improved=False, decay=False, stop=True)
    # An improvement resets the count.
    assert s.decide([0.70, 0.75, 0.74, 0.76]) == Decision(3, improved=True, decay=False, stop=False)


def test_log_loss_is_better_when_lower_and_tiny_gains_are_noise():
    s = Selection("logloss", patience=1, min_delta=1e-3)
    assert s.decide([0.50, 0.45]).best_epoch == 1
    assert s.decide([0.50, 0.4995]) == Decision(0, improved=False, decay=False, stop=True)


def test_patience_zero_never_stops_and_decay_one_never_decays():
    d = Selection("auc", patience=0, decay=1.0).decide([0.8, 0.7, 0.6, 0.5])
    assert d == Decision(0, improved=False, decay=False, stop=False)


def test_a_nan_score_is_never_the_best():
    assert Selection("auc").decide([float("nan"), 0.6]).best_epoch == 1
    assert Selection("auc").decide([0.6, float("nan")]).best_epoch == 0


def test_decisions_cross_the_wire_as_json_and_bad_ones_are_named():
    d = Decision(3, True, False, True)
    assert Decision.from_json(d.to_json()) == d
    with pytest.raises(ConfigError, match="best_epoch"):
        Decision.from_json({"stop": True})


@pytest.mark.parametrize("kw,message", [({"monitor": "f1"}, "--monitor"), ({"patience": -1}, "--patience"),
                                        ({"decay": 0}, "--lr-decay"), ({"decay": 1.5}, "--lr-decay")])
def test_bad_settings_are_refused(kw, message):
    with pytest.raises(ConfigError, match=message):
        Selection(**kw)


def test_decay_after_n_epochs_decays_every_nth_epoch_without_improvement():
    """Issue 32: on a small table one noisy validation score decayed the rates for good; with
    decay_after 2 the rates decay after the second epoch without a gain, then patience stops."""
    s = Selection("auc", patience=4, decay=0.1, decay_after=2)
    flat = [0.70, 0.75]
    decays = [s.decide(flat + [0.74] * k).decay for k in range(1, 5)]
    assert decays == [False, True, False, False]
    assert s.decide(flat + [0.74] * 4) == Decision(1, improved=False, decay=False, stop=True)
    with pytest.raises(ConfigError, match="--lr-decay-after"):
        Selection(decay_after=0)


def test_gauc_is_a_monitor_where_higher_is_better():
    assert Selection("gauc", patience=1).decide([0.6, 0.62]).best_epoch == 1


def test_the_monitor_follows_the_label_kind_and_lower_rmse_is_better():
    """Issue 32: a regression picks epochs by validation RMSE (lower is better) unless told; a metric
    the label has not is refused, as is GAUC for a regression."""
    from paramshard.apps.ctr.options import parser, resolve
    from paramshard.apps.ctr.selection import settle_monitor
    from paramshard.specs.schema import Column, Label, Schema

    regression = Schema(Label("price"), [Column("c", "categorical")], label_kind="regression")
    binary = Schema(Label("y"), [Column("c", "categorical")])

    def args(*extra):
        return resolve(parser("").parse_args(["--train", "t.csv", "--test", "t.csv", "--schema", "s.json", *extra]))

    a = args()
    settle_monitor(a, regression)
    assert (a.monitor, a.selection.monitor) == ("rmse", "rmse")
    assert a.selection.decide([2.0, 1.5, 1.7]) == Decision(1, False, decay=True, stop=False)     # 1.5 is the best
    b = args()
    settle_monitor(b, binary)
    assert b.monitor == "auc"
    c = args("--monitor", "mae")
    settle_monitor(c, regression)
    assert c.selection.monitor == "mae"
    with pytest.raises(ConfigError, match=r"--monitor auc: a regression label \('price'\) has rmse, mse, mae"):
        settle_monitor(args("--monitor", "auc"), regression)
    with pytest.raises(ConfigError, match=r"--monitor rmse: a binary label has auc, logloss, accuracy, gauc"):
        settle_monitor(args("--monitor", "rmse"), binary)
    with pytest.raises(ConfigError, match=r"--group-by user: GAUC is an AUC per group, and a regression label"):
        settle_monitor(args("--group-by", "user"), regression)
