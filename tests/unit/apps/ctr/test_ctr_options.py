"""The CTR app's options: the model's defaults fill what the user left out, explicit flags win,
and the library's model classes and the app build the same network."""
import pytest

from paramshard.apps.ctr.loss_check import base_rate_logloss, beats_the_base_rate, loss_fell
from paramshard.apps.ctr.options import describe, parser, resolve
from paramshard.errors import ConfigError
from paramshard.models import MODELS
from paramshard.models.defaults import TRAINING, architecture_defaults

BASE = ["--train", "t.csv", "--test", "s.csv", "--schema", "x.json"]


def args(*extra):
    return resolve(parser("ctr").parse_args(BASE + list(extra)))


def test_every_model_has_training_defaults():
    assert set(TRAINING) == set(MODELS)


def test_a_model_left_to_its_defaults_takes_them_and_says_so():
    a = args("--model", "lr")
    assert (a.lr, a.table_lr, a.batch_size) == (TRAINING["lr"].lr, TRAINING["lr"].table_lr, 256)
    assert a.architecture == {}
    assert "(the model's default)" in describe(a)
    d = args("--model", "deepfm")
    assert d.architecture == architecture_defaults(MODELS["deepfm"]) == {"dim": 16, "hidden": (400, 400)}


def test_logistic_regression_learns_faster_than_the_deep_models():
    assert TRAINING["lr"].lr >= 10 * TRAINING["deepfm"].lr - 1e-12
    assert TRAINING["lr"].table_lr >= 4 * TRAINING["deepfm"].table_lr - 1e-12


def test_explicit_flags_win():
    a = args("--model", "dcn", "--lr", "0.01", "--dim", "4", "--hidden", "32,16")
    assert a.lr == 0.01 and "lr" not in a.defaulted
    assert a.architecture == {"dim": 4, "cross_layers": 3, "hidden": (32, 16)}


@pytest.mark.parametrize("extra,message", [
    (["--model", "lr", "--dim", "4"], "has no dim"), (["--lr", "0"], "--lr must be > 0"),
    (["--hidden", "a,b"], "expected widths"), (["--valid-fraction", "1"], "must be in"),
    (["--valid", "v.csv", "--valid-fraction", "0.3"], "not both"), (["--epochs", "0"], "--epochs"),
    (["--embedding-l2", "-1"], "--embedding-l2"), (["--patience", "-2"], "--patience")])
def test_bad_values_are_named(extra, message):
    with pytest.raises(ConfigError, match=message):
        args(*extra)


def test_a_falling_loss_and_a_flat_one():
    assert loss_fell([1.0] * 3) is None
    fell, first, last = loss_fell([0.7 - 0.01 * i for i in range(20)])
    assert fell and last < first
    assert not loss_fell([0.69] * 20)[0]


def test_the_base_rate_log_loss_is_the_label_entropy():
    assert base_rate_logloss(0.5) == pytest.approx(0.693147, abs=1e-6)
    assert beats_the_base_rate(0.5, 0.25) and not beats_the_base_rate(0.6, 0.25)


def test_overfitting_is_two_epochs_of_falling_training_and_rising_validation_loss():
    from paramshard.apps.ctr.loss_check import overfitting
    h = [(1, 0.50, 0.40), (2, 0.45, 0.38), (3, 0.40, 0.39)]
    assert overfitting(h) is None                             # one epoch of it: noise
    h.append((4, 0.35, 0.41))
    assert overfitting(h) == (2, 4)                           # named once, when it becomes a trend
    assert overfitting(h + [(5, 0.30, 0.45)]) is None         # the same stretch is not named again
    assert overfitting(h[:-1] + [(4, 0.41, 0.41)]) is None    # the training loss rose too: no overfitting
    assert overfitting([(1, float("nan"), 0.3), (2, 0.4, 0.31), (3, 0.3, 0.32)]) is None   # a NaN breaks it
