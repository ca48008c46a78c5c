"""Bags: Parquet list columns become multi-valued columns like `a|b|c` cells, `--multi COL:SEP`
splits a text column on another separator, and a bag keeps the order of its cell."""
import json

import numpy as np
import pandas as pd
import pytest

from paramshard.cli.main import main as cli_main
from paramshard.data.features.batch import TabularBatch
from paramshard.data.features.fit import fit_schema
from paramshard.data.features.hashing import MISSING_TOKEN, feature_ids
from paramshard.data.features.infer import infer_schema
from paramshard.data.readers.tabular import TabularReader
from paramshard.data.shards.holdout import Holdout
from paramshard.errors import ConfigError
from paramshard.specs.schema import Column, Schema

HISTORY = [["m3", "m1", "m2"], ["m2"], [], None, ["m1", "m1", "m9"], ["m4", "m3"]] * 30
TOPICS = [[7, 3], [3], [1, 2, 3], [2], None, [9]] * 30


@pytest.fixture
def lists(tmp_path):
    n = len(HISTORY)
    df = pd.DataFrame({"history": pd.Series(HISTORY, dtype=object), "topics": pd.Series(TOPICS, dtype=object),
                       "genre": ["Drama/War", "Comedy", "War/Comedy"] * (n // 3),
                       "age": np.arange(n) % 50, "click": [0, 1] * (n // 2)})
    df.to_parquet(tmp_path / "events.parquet")
    return tmp_path / "events.parquet"


def bag_ids(batch: TabularBatch, row: int, field: int) -> list[int]:
    f = batch.num_fields
    start = batch.offsets[row * f + field]
    stop = batch.offsets[row * f + field + 1] if row * f + field + 1 < len(batch.offsets) else len(batch.ids)
    return batch.ids[start:stop].tolist()


def test_parquet_list_columns_become_ordered_bags(lists):
    s = infer_schema(lists)         # before issue 32: TypeError: unhashable type: 'list'
    for name in ("history", "topics"):
        c = s.column(name)
        assert (c.kind, c.list_column) == ("multi", True) and "list column" in c.note
    fitted = fit_schema(s, [lists])
    assert fitted.column("history").stats["distinct"] == 5          # m1 m2 m3 m4 m9
    batch = TabularBatch.concat(list(TabularReader([lists], fitted, batch_size=50)))
    field = {c.name: i for i, c in enumerate(fitted.fields)}
    for row in range(6):
        history = HISTORY[row] or [MISSING_TOKEN]           # an empty or missing list: the missing id
        assert bag_ids(batch, row, field["history"]) == feature_ids("history", np.array(history, object)).tolist()
        topics = [str(t) for t in TOPICS[row]] if TOPICS[row] else [MISSING_TOKEN]
        assert bag_ids(batch, row, field["topics"]) == feature_ids("topics", np.array(topics, object)).tolist()


def test_a_text_bag_keeps_its_order_and_repeats(tmp_path):
    (tmp_path / "t.csv").write_text("seq,y\n" + "c|a|b|a,1\nb|c,0\n" * 60)
    s = infer_schema(tmp_path / "t.csv")
    batch = TabularBatch.concat(list(TabularReader([tmp_path / "t.csv"], s, batch_size=7)))
    assert bag_ids(batch, 0, 0) == feature_ids("seq", np.array(list("caba"), object)).tolist()


def test_a_hold_out_by_content_reads_list_columns(lists):
    s = fit_schema(infer_schema(lists), [lists])
    held = Holdout(0.3, seed=1, by="content")
    parts = [len(TabularBatch.concat(list(TabularReader([lists], s, 64, holdout=h)))) for h in (held, held.other())]
    assert sum(parts) == len(HISTORY) and min(parts) > 0


def test_multi_splits_a_text_column_on_another_separator(lists, tmp_path, capsys):
    s = infer_schema(lists, multi=["genre:/"])
    c = s.column("genre")
    assert (c.kind, c.separator, c.list_column) == ("multi", "/", False) and "--multi genre:/" in c.note
    out = tmp_path / "s.json"
    assert cli_main(["schema", "infer", str(lists), "--multi", "genre:/", "-o", str(out)]) == 0
    genre = next(c for c in json.loads(out.read_text())["columns"] if c["name"] == "genre")
    assert genre["separator"] == "/" and genre["kind"] == "multi"
    assert cli_main(["schema", "show", str(out)]) == 0
    assert "list per cell (order kept)" in capsys.readouterr().out


@pytest.mark.parametrize("multi,match", [
    (["genre"], "--multi 'genre': expected COLUMN:SEPARATOR"),
    (["genr:/"], r"--multi genr: no such column \(did you mean 'genre'\?\)"),
    (["history:,"], "--multi history: it is a list column"),
])
def test_multi_mistakes_are_clear_errors(lists, multi, match):
    with pytest.raises(ConfigError, match=match):
        infer_schema(lists, multi=multi)


def test_list_column_is_only_for_bags():
    with pytest.raises(ConfigError, match="list_column: true .* its kind must be multi"):
        Schema.from_dict({"label": "y", "columns": [{"name": "h", "kind": "categorical", "list_column": True}]})
    assert Column("h", "multi", list_column=True).list_column
