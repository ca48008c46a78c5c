"""Behaviour sequences (`schema infer --sequence SEQ:CAND`, ``sequence_of``): the sequence's values
are hashed in its candidate's id space, so an item has one id (one row of each table) in both."""
import numpy as np
import pandas as pd
import pytest

from paramshard.cli.main import main as cli_main
from paramshard.data.features.batch import TabularBatch
from paramshard.data.features.hashing import MISSING_TOKEN, feature_id, feature_ids
from paramshard.data.features.infer import infer_schema
from paramshard.data.readers.tabular import TabularReader
from paramshard.errors import ConfigError
from paramshard.specs.schema import Column, Label, Schema

from tests.unit.data.features.test_data_bags import bag_ids

ROWS = ["7,3|9|7,1", "9,,0", "3,9,1", "12,3|12,0"] * 30      # item_id,hist_item_ids,click


@pytest.fixture
def events(tmp_path):
    (tmp_path / "e.csv").write_text("item_id,hist_item_ids,click\n" + "\n".join(ROWS) + "\n")
    return tmp_path / "e.csv"


def test_a_sequence_shares_its_candidates_ids_and_keeps_its_order(events):
    s = infer_schema(events, label="click", sequence=["hist_item_ids:item_id"])
    item, hist = s.column("item_id"), s.column("hist_item_ids")
    # item ids are whole numbers (numeric to the guess) and hist holds one value on some rows:
    # --sequence makes them a category and an ordered bag of it.
    assert (item.kind, hist.kind, hist.sequence_of) == ("categorical", "multi", "item_id")
    assert "--sequence" in hist.note and s.sequences == [(1, 0)]
    batch = TabularBatch.concat(list(TabularReader([events], s, batch_size=5)))
    assert bag_ids(batch, 0, 1) == feature_ids("item_id", np.array(["3", "9", "7"], object)).tolist()
    assert bag_ids(batch, 0, 0) == [feature_id("item_id", "7")]       # the candidate: the same id as in the history
    # An empty history keeps its own "missing" id, not the candidate's.
    assert bag_ids(batch, 1, 1) == [feature_id("hist_item_ids", MISSING_TOKEN)]
    assert bag_ids(batch, 3, 1) == feature_ids("item_id", np.array(["3", "12"], object)).tolist()


def test_sequence_round_trips_and_an_older_schema_without_it_loads():
    s = Schema(Label("y"), [Column("item", "categorical"), Column("hist", "multi", sequence_of="item")])
    again = Schema.from_dict(s.to_dict())
    assert again.column("hist").sequence_of == "item" and again.sequences == [(1, 0)]
    old = s.to_dict()
    for c in old["columns"]:
        del c["sequence_of"]
    assert Schema.from_dict(old).sequences == []


@pytest.mark.parametrize("columns, match", [
    ([Column("item", "categorical"), Column("hist", "multi", sequence_of="itme")], "no such column"),
    ([Column("item", "numeric"), Column("hist", "multi", sequence_of="item")], "kind is 'numeric'"),
    ([Column("item", "categorical"), Column("hist", "categorical", sequence_of="item")], "needs kind multi"),
])
def test_a_wrong_sequence_of_is_refused_with_the_reason(columns, match):
    with pytest.raises(ConfigError, match=match):
        Schema(Label("y"), columns)


@pytest.mark.parametrize("sequence, match", [
    ("hist_item_ids", "expected SEQUENCE:CANDIDATE"),
    ("hist_item_ids:itme_id", "no column 'itme_id'"),
    ("hist_item_ids:click", "label column"),
])
def test_sequence_mistakes_are_clear_errors(events, sequence, match):
    with pytest.raises(ConfigError, match=match):
        infer_schema(events, label="click", sequence=[sequence])


def test_the_cli_records_the_sequence_and_show_says_it(events, tmp_path, capsys):
    out = tmp_path / "s.json"
    assert cli_main(["schema", "infer", str(events), "--label", "click", "--sequence", "hist_item_ids:item_id",
                     "-o", str(out)]) == 0
    assert Schema.load(out).column("hist_item_ids").sequence_of == "item_id"
    assert cli_main(["schema", "show", str(out)]) == 0
    assert "sequence of item_id" in capsys.readouterr().out


def test_a_parquet_list_history_stays_a_list(tmp_path):
    df = pd.DataFrame({"item": ["a", "b"] * 20, "hist": pd.Series([["b", "a"], ["a"]] * 20, dtype=object),
                       "y": [0, 1] * 20})
    df.to_parquet(tmp_path / "e.parquet")
    s = infer_schema(tmp_path / "e.parquet", sequence="hist:item")
    assert (s.column("hist").list_column, s.column("hist").sequence_of) == (True, "item")
