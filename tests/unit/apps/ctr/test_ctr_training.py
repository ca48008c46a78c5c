"""The CTR app's run, in pieces: inputs checked before anything trains, the same table
settings in every mode."""
import argparse

import pytest

import paramshard as ps
from paramshard.apps.ctr.options import parser, resolve
from paramshard.apps.ctr.training import load_schema, make_model
from paramshard.specs.schema import Column, Format, Label, Schema
from paramshard.errors import ConfigError
from paramshard.models.hashed import HashedEmbeddingBag


@pytest.fixture
def files(tmp_path):
    (tmp_path / "train.csv").write_text("age,city,y\n" + "".join(f"{20 + i % 40},c{i % 7},{i % 2}\n" for i in range(600)))
    (tmp_path / "test.csv").write_text("age,city,y\n30,c1,1\n40,c2,0\n")
    (tmp_path / "empty.csv").write_text("age,city,y\n")
    (tmp_path / "typo.csv").write_text("age,citty,y\n30,c1,1\n")
    Schema(Label("y"), [Column("age", transforms=["standardize"]), Column("city", "categorical")],
           format=Format()).save(tmp_path / "s.json")
    return tmp_path


def app_args(d, *extra) -> argparse.Namespace:
    return resolve(parser("ctr").parse_args(["--train", str(d / "train.csv"), "--test", str(d / "test.csv"),
                                             "--schema", str(d / "s.json"), *extra]))


def test_a_good_run_loads_and_fits_its_schema(files):
    schema = load_schema(app_args(files, "--batch-size", "16"), 2, lambda _: None)
    assert not schema.unfitted()


def test_an_empty_test_file_is_named_before_any_training(files):
    args = app_args(files)
    args.test = [str(files / "empty.csv")]
    with pytest.raises(ConfigError, match="--test.*empty.csv.*no data rows|empty.csv.*no data rows"):
        load_schema(args, 1, lambda _: None)


def test_an_empty_training_file_is_not_told_to_use_a_smaller_batch(files):
    args = app_args(files)
    args.train = [str(files / "empty.csv")]
    with pytest.raises(ConfigError, match="no data rows") as err:
        load_schema(args, 1, lambda _: None)
    assert "batch-size" not in str(err.value)


def test_a_misspelt_column_gets_a_did_you_mean(files):
    args = app_args(files)
    args.test = [str(files / "typo.csv")]
    with pytest.raises(ConfigError, match="did you mean.*citty|citty"):
        load_schema(args, 1, lambda _: None)


def test_the_delimiter_flag_reads_a_semicolon_file_with_a_comma_schema(files):
    for name in ("train", "test"):
        text = (files / f"{name}.csv").read_text().replace(",", ";")
        (files / f"{name}.semi.csv").write_text(text)
    args = app_args(files, "--batch-size", "16")
    args.train, args.test = [str(files / "train.semi.csv")], [str(files / "test.semi.csv")]
    with pytest.raises(ConfigError, match="looks separated by ';', not ',': pass --delimiter ';'"):
        load_schema(args, 1, lambda _: None)
    args.delimiter = ";"
    schema = load_schema(args, 1, lambda _: None)
    assert schema.format.delimiter == ";" and not schema.format.by_suffix and schema.rows_fitted == 600


def test_collective_mode_trains_the_tables_with_the_table_settings(files):
    args = app_args(files, "--model", "deepfm", "--table-lr", "0.07", "--embedding-l2", "1e-4", "--buckets", "64",
                    "--dim", "4", "--hidden", "8")
    schema = load_schema(args, 1, lambda _: None)
    model = make_model(args, schema, has_servers=False)
    tables = [m for m in model.modules() if isinstance(m, HashedEmbeddingBag)]
    assert len(tables) == 2
    assert all(t.row_optimizer == ps.optim.Adagrad(lr=0.07, weight_decay=1e-4) for t in tables)


# -- elastic jobs (apps/ctr/elastic.py) ------------------------------------------------------------

class _Env:
    def __init__(self, trainer_id=1, joining=False, min_trainers=1):
        self.trainer_id, self.joining, self.min_trainers = trainer_id, joining, min_trainers


class _Joined:
    def __init__(self, counts):
        self.trainer_id, self.counts = 2, counts

    def barrier_counts(self):
        return dict(self.counts)


def test_an_elastic_app_refuses_what_cannot_work_saying_why(files):
    from paramshard.apps.ctr import elastic
    args, schema = app_args(files), Schema.load(files / "s.json")
    elastic.refuse(args, _Env(trainer_id=1, joining=True), schema)         # any other slot may join
    elastic.refuse(args, _Env(trainer_id=0, joining=True, min_trainers=None), schema)   # not elastic: no join
    with pytest.raises(ConfigError, match="trainer 0 of the CTR app cannot be replaced.*validation history"):
        elastic.refuse(args, _Env(trainer_id=0, joining=True), schema)
    assert elastic.holdout(args, True).by == "content" and elastic.holdout(args, False).by == "record"


@pytest.mark.parametrize("counts, expected", [
    ({}, (1, False)),                                          # before the first epoch's end
    ({"epoch-end": 2, "selection": 2}, (3, False)),            # mid-epoch 3
    ({"epoch-end": 3, "selection": 2}, (3, True)),             # trainer 0 is deciding epoch 3
])
def test_a_joiner_takes_the_epoch_whose_decision_is_not_made_yet(counts, expected):
    from paramshard.apps.ctr import elastic
    assert elastic.joined_at(_Joined(counts)) == expected


def test_counts_the_app_never_makes_are_an_error():
    from paramshard.apps.ctr import elastic
    with pytest.raises(ConfigError, match="differ by at most one"):
        elastic.joined_at(_Joined({"epoch-end": 5, "selection": 2}))


# -- issue 32: what a run says about its epochs, and --weight / --group-by against the schema -------

class _Chief:
    trainer_id, joining, min_trainers, checkpoint_dir = 0, False, None, None


def run_with(files, history, *extra):
    from paramshard.apps.ctr.training import Run
    said = []
    run = Run(app_args(files, *extra), _Chief(), said.append)
    run.history = {e: {"epoch": e, "train_loss": t, "valid": {"logloss": v}} for e, t, v in history}
    return run, said


def test_overfitting_epochs_are_named_once_with_what_to_try(files):
    run, said = run_with(files, [(1, 0.50, 0.40), (2, 0.40, 0.41)])
    try:
        run.check_overfitting()
        assert said == []                              # one epoch of it is noise
        run.history[3] = {"epoch": 3, "train_loss": 0.30, "valid": {"logloss": 0.45}}
        run.check_overfitting()
        assert len(said) == 1 and said[0].startswith("warning: over epochs 1-3 the training loss fell (0.5000 -> "
                                                     "0.3000) while the validation log loss rose (0.4000 -> 0.4500)")
        assert "--embedding-l2" in said[0] and "fewer --epochs" in said[0] and "id-like column" in said[0]
        assert run.warnings == [said[0][len("warning: "):]]
    finally:
        run.close()


def test_a_run_that_reaches_the_epoch_cap_still_improving_gets_a_hint(files):
    from paramshard.apps.ctr.selection import Decision
    run, said = run_with(files, [(1, 0.5, 0.40), (2, 0.4, 0.39), (3, 0.3, 0.38)], "--epochs", "3")
    try:
        run.hint_at_the_cap(Decision(2, improved=False, decay=True, stop=False), 3)      # not the best: no hint
        run.hint_at_the_cap(Decision(3, improved=True, decay=False, stop=False), 2)      # not the cap
        assert said == []
        run.hint_at_the_cap(Decision(3, improved=True, decay=False, stop=False), 3)
        assert said == ["hint: still improving at epoch 3 (validation auc best so far): try --epochs 6"]
        assert run.hints and not run.warnings         # advice, not a warning
    finally:
        run.close()


def test_weight_and_group_columns_are_checked_against_the_schema_and_files(files):
    schema = load_schema(app_args(files, "--weight", "age", "--group-by", "city"), 1, lambda _: None)
    assert schema.column("age").kind == "drop" and schema.column("city").kind == "categorical"
    for extra, message in ((["--weight", "city"], "a categorical column"), (["--weight", "y"], "the label"),
                           (["--group-by", "zip"], "no such column")):
        with pytest.raises(ConfigError, match=message):
            load_schema(app_args(files, *extra), 1, lambda _: None)
    # A side column the schema drops must still be in every file: named before anything trains.
    Schema(Label("y"), [Column("age"), Column("city", "categorical"), Column("w", "drop")]).save(files / "s.json")
    with pytest.raises(ConfigError, match="--train.*lacks the schema's column.*'w'"):
        load_schema(app_args(files, "--weight", "w"), 1, lambda _: None)
