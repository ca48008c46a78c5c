"""Issue 32: defaults that hold on small tables (apps/ctr/table_size.py): a minimum of validation
rows, gentler selection, explicit flags win."""
import pytest

from paramshard.apps.ctr import table_size
from paramshard.apps.ctr.options import parser, resolve
from paramshard.apps.ctr.selection import Decision
from paramshard.errors import ConfigError

BASE = ["--train", "t.csv", "--test", "s.csv", "--schema", "x.json"]


def settled(rows, *extra):
    args = resolve(parser("ctr").parse_args(BASE + list(extra)))
    note = table_size.settle(args, rows)
    return args, note


@pytest.mark.parametrize("rows,held", [(3_600, 900), (5_000, 1_000), (10_000, 1_000), (2_000_000, 200_000),
                                       (400, 100)])
def test_the_hold_out_has_a_minimum_of_rows_and_at_most_a_quarter(rows, held):
    args, _ = settled(rows)
    assert args.valid_fraction * rows == pytest.approx(held)
    assert table_size.valid_fraction(rows) == args.valid_fraction


def test_the_issue_32_table_holds_out_900_rows_not_366_with_a_gentler_selection():
    args, note = settled(3_660)
    assert round(args.valid_fraction * 3_660) == 915 and (args.patience, args.lr_decay_after) == (4, 2)
    assert "small table" in note and "patience 4" in note
    # One epoch without a gain no longer decays the rates; the second does; the fourth stops.
    s = args.selection
    assert [s.decide([0.80, 0.81] + [0.805] * k) for k in (1, 2, 4)] == [
        Decision(1, False, False, False), Decision(1, False, True, False), Decision(1, False, False, True)]


def test_a_large_table_keeps_the_benchmark_suites_rule_and_says_nothing():
    args, note = settled(1_000_000)
    assert (args.valid_fraction, args.patience, args.lr_decay_after) == (0.1, 2, 1) and note == ""
    assert args.selection.decide([0.80, 0.81, 0.805]).decay


def test_explicit_flags_win_over_the_table_size():
    args, note = settled(3_600, "--valid-fraction", "0.1", "--patience", "2", "--lr-decay-after", "1", "--epochs", "10")
    assert (args.valid_fraction, args.patience, args.lr_decay_after, args.epochs) == (0.1, 2, 1, 10) and note == ""
    args, _ = settled(3_600, "--patience", "3")            # decays after half the patience, at least 1
    assert (args.patience, args.lr_decay_after) == (3, 1)
    args, _ = settled(3_600, "--valid", "v.csv")
    assert args.valid == ["v.csv"] and args.patience == 4


@pytest.mark.parametrize("extra,message", [
    (["--lr-decay-after", "0"], "--lr-decay-after"), (["--monitor", "gauc"], "--monitor gauc needs --group-by"),
    (["--weight", "w", "--group-by", "w"], "same column")])
def test_bad_new_flags_are_named(extra, message):
    with pytest.raises(ConfigError, match=message):
        resolve(parser("ctr").parse_args(BASE + extra))


def test_counting_the_rows_stops_once_past_what_the_defaults_need(tmp_path):
    from paramshard.data.readers.tabular import count_records
    from paramshard.specs.schema import Column, Label, Schema
    schema = Schema(Label("y"), [Column("x")])
    for name in ("a.csv", "b.csv"):
        (tmp_path / name).write_text("x,y\n" + "".join(f"{i},{i % 2}\n" for i in range(300)))
    files = [tmp_path / "a.csv", tmp_path / "b.csv"]
    assert count_records(files, schema) == 600 == count_records(files, schema, up_to=600)
    assert 250 < count_records(files, schema, up_to=250) <= 300        # the second file is not read
    args, _ = settled(count_records(files, schema, up_to=table_size.SMALL_TABLE_ROWS))
    assert args.valid_fraction == 0.25


@pytest.mark.parametrize("rows,epochs", [(1_070, 64), (5_822, 11), (23_486, 10), (400, 100), (2_000_000, 10)])
def test_the_epoch_cap_gives_a_small_table_200_batches(rows, epochs):
    """The 1,070-row OJ table, a quarter held out: 803 rows, 3 batches of 256 an epoch; 64 epochs
    are 200 batches. From a few thousand rows on, ten epochs are more than that already."""
    args, note = settled(rows)
    assert args.epochs == epochs == table_size.epochs(rows, 256, args.valid_fraction)
    assert (f"at most {epochs} epochs" in note) is (epochs != 10)


def test_an_explicit_epoch_count_wins_and_the_batch_size_counts():
    assert settled(1_070, "--epochs", "7")[0].epochs == 7
    assert settled(1_070, "--batch-size", "64")[0].epochs == 16      # 200 batches of 64 over 803 rows
    assert settled(1_070, "--valid", "v.csv")[0].epochs == 48         # nothing held out of 1,070 rows
