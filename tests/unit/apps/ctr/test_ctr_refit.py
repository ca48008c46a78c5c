"""Issue 32: the refit rule (apps/ctr/refit.py): which runs train a fresh model on all of --train
after selection, and the flags that win."""
import pytest

from paramshard.apps.ctr import refit, table_size
from paramshard.apps.ctr.options import parser, resolve
from paramshard.errors import ConfigError

BASE = ["--train", "t.csv", "--test", "s.csv", "--schema", "x.json"]


def planned(rows, *extra, standalone=True):
    args = resolve(parser("ctr").parse_args(BASE + list(extra)))
    note = refit.settle(args, rows, standalone)
    return args.refit_planned, note


@pytest.mark.parametrize("rows,refits", [(400, True), (3_600, True), (99_999, True), (100_000, False),
                                         (5_000_000, False)])
def test_auto_refits_a_small_table_only(rows, refits):
    did, note = planned(rows)
    assert did is refits
    assert ("refit" in note and f"{rows:,} rows" in note) if refits else note == ""


def test_flags_win_over_the_table_size():
    assert planned(3_600, "--refit", "never") == (False, "")
    did, note = planned(5_000_000, "--refit", "always")
    assert did and "--refit always" in note
    # A hold-out the user chose not to carve out of --train: nothing to refit, nothing to say.
    for extra in (["--valid", "v.csv"], ["--valid-fraction", "0"], ["--lr-decay-at", "3"]):
        assert planned(3_600, *extra) == (False, "")
    # An explicit --valid-fraction still refits: the held-out rows are what the refit gets back.
    assert planned(3_600, "--valid-fraction", "0.2")[0]


@pytest.mark.parametrize("extra,message", [(["--valid", "v.csv"], "--valid files"),
                                           (["--valid-fraction", "0"], "no hold-out"),
                                           (["--lr-decay-at", "2"], "fixed schedule")])
def test_always_is_refused_where_there_is_nothing_to_refit(extra, message):
    with pytest.raises(ConfigError, match=f"--refit always: .*{message}"):
        planned(3_600, "--refit", "always", *extra)


def test_a_launched_job_does_not_refit_and_says_why():
    did, note = planned(3_600, standalone=False)
    assert not did and note.startswith("no refit on this small table") and "launched job" in note
    assert planned(3_600, "--refit", "never", standalone=False) == (False, "")
    assert planned(500_000, standalone=False) == (False, "")          # a large table: no refit anyway
    with pytest.raises(ConfigError, match="--refit always: a launched job"):
        planned(3_600, "--refit", "always", standalone=False)


def test_the_launcher_refuses_refit_always_before_starting_anything():
    from paramshard.apps.ctr import check_arguments
    with pytest.raises(ConfigError, match="--refit always: a launched job"):
        check_arguments(BASE + ["--refit", "always"], files=False)
    check_arguments(BASE + ["--refit", "auto"], files=False)       # auto: says so at the start, keeps the best epoch


def test_the_schedule_repeats_the_decays_before_the_best_epoch():
    assert refit.schedule({"best_epoch": 6, "lr_decays": [2, 5, 8]}) == (6, (2, 5))
    assert refit.schedule({"best_epoch": 3, "lr_decays": [3]}) == (3, ())     # a decay after the last epoch: none
    args = resolve(parser("ctr").parse_args(BASE + ["--json", "o.json", "--export", "m.pt", "--seed", "7"]))
    again = refit.refit_args(args, 6, (2, 5))
    assert (again.valid_fraction, again.epochs, again.lr_decay_at, again.refit, again.json) == (0, 6, (2, 5), "never",
                                                                                                None)
    assert (again.export, again.seed, args.epochs, args.json) == ("m.pt", 7, 10, "o.json")    # the original unchanged
    assert refit.flags(6, (2, 5)) == "--valid-fraction 0 --epochs 6 --lr-decay-at 2,5"
    assert refit.flags(4, ()) == "--valid-fraction 0 --epochs 4 --lr-decay 1"


@pytest.mark.parametrize("text,epochs", [("3", (3,)), ("5,2,5", (2, 5)), ("", ())])
def test_lr_decay_at_reads_epoch_numbers(text, epochs):
    assert resolve(parser("ctr").parse_args(BASE + ["--lr-decay-at", text])).lr_decay_at == epochs


@pytest.mark.parametrize("text", ["0", "a,b", "-1"])
def test_bad_lr_decay_at_is_named(text):
    with pytest.raises(ConfigError, match="--lr-decay-at"):
        resolve(parser("ctr").parse_args(BASE + [f"--lr-decay-at={text}"]))


@pytest.mark.parametrize("rows,count", [(1_070, 4), (1_600, 3), (2_400, 2), (3_999, 2), (4_000, 1), (50_000, 1),
                                        (300, 5)])
def test_a_table_too_small_for_a_1000_row_hold_out_repeats_it_without_decays(rows, count):
    """A quarter of 1,070 rows is 268: four hold-outs score 1,070 rows in all; from 4,000 rows on
    one hold-out has its 1,000 rows."""
    args = resolve(parser("ctr").parse_args(BASE))
    table_size.settle(args, rows)
    note = refit.settle(args, rows, standalone=True)
    assert args.refit_planned and args.holdouts == count
    assert (args.lr_decay, args.selection.decay) == ((1.0, 1.0) if count > 1 else (0.1, 0.1))
    assert (f"refit: {count} hold-outs of" in note) is (count > 1)


def test_an_explicit_hold_out_is_one_hold_out():
    args = resolve(parser("ctr").parse_args(BASE + ["--valid-fraction", "0.25"]))
    table_size.settle(args, 1_070)
    refit.settle(args, 1_070, standalone=True)
    assert args.refit_planned and args.holdouts == 1 and args.lr_decay == 0.1


def test_repeated_hold_outs_draw_other_rows_for_the_same_model():
    args = resolve(parser("ctr").parse_args(BASE + ["--seed", "3", "--export", "m.pt"]))
    again = [refit.repeat_args(args, k) for k in range(3)]
    assert len({a.holdout_seed for a in again}) == 3 and again[0].holdout_seed == 3
    assert all((a.seed, a.export, a.refit, a.lr_decay) == (3, None, "never", 1.0) for a in again)


def test_the_epoch_count_of_several_hold_outs_is_the_best_of_their_mean():
    outs = [{"epochs": [{"valid": {"auc": v, "logloss": 1 - v}} for v in curve]}
            for curve in ([0.70, 0.74, 0.73, 0.72], [0.70, 0.71, 0.75], [0.71, 0.74, 0.74, 0.70, 0.60])]
    epochs, mean = refit.pooled_best(outs, "auc")     # over the 3 epochs every hold-out ran
    assert mean == pytest.approx([0.7033333, 0.73, 0.74]) and epochs == 3
    assert refit.pooled_best(outs, "logloss")[0] == 3          # lower is better there
    assert refit.pooled_best([{"epochs": [{"valid": {"auc": 0.7}}] * 3}], "auc")[0] == 1     # a tie: the earliest
