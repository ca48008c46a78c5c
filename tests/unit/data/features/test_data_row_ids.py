"""`schema infer` drops row ids (a different value on every row) with the reason and how to keep
them, warns about categories with distinct values for most rows, and drops what --drop names."""
import json

import numpy as np
import pandas as pd
import pytest

from paramshard.cli.main import main as cli_main
from paramshard.data.features.infer import infer, infer_schema
from paramshard.errors import ConfigError


def table(n=400, seed=0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "id": rng.permutation(n) + 1000,                       # a row id, shuffled: every value once
        "name": [f"customer {i}" for i in range(n)],           # text naming the row
        "balance": np.round(rng.normal(1000, 300, n), 2),      # every value different too, but a measure
        "job": rng.choice(["admin", "services", "retired"], n),
        "city": [f"town{i}" for i in rng.integers(0, int(n * 0.8), n)],   # most values once: memorised
        "age": rng.integers(18, 90, n),
        "y": rng.choice(["yes", "no"], n, p=[0.2, 0.8])})


@pytest.fixture
def csv(tmp_path):
    path = tmp_path / "bank.csv"
    table().to_csv(path, index=False)
    return path


def test_a_row_id_column_is_dropped_with_the_reason_and_how_to_keep_it(csv):
    got = infer(csv)
    s = got.schema
    # Before issue 32 `id` was a category (sequential ids by its values): one embedding per row.
    assert s.column("id").kind == "drop"
    assert "a row id" in s.column("id").note and "--categorical id" in s.column("id").note
    assert s.column("name").kind == "drop" and "every one of the 400 sampled values different" in s.column("name").note
    assert s.column("balance").kind == "numeric"            # unique, but a number measuring something
    assert {c.name for c in s.columns if c.kind != "drop"} == {"balance", "job", "city", "age"}
    assert dict(got.dropped).keys() == {"id", "name"}


def test_a_row_id_named_so_is_dropped_in_a_small_table(tmp_path):
    pd.DataFrame({"index": range(30), "x": [1.5, 2.5, 3.5] * 10, "label": [0, 1] * 15}).to_csv(
        tmp_path / "t.csv", index=False)
    assert infer_schema(tmp_path / "t.csv").column("index").kind == "drop"


def test_the_override_keeps_a_row_id(csv):
    s = infer_schema(csv, categorical="id")
    assert s.column("id").kind == "categorical" and "--categorical on the command line" in s.column("id").note


def test_a_category_with_values_for_most_rows_is_warned_about(csv):
    warnings = infer(csv).warnings
    assert len(warnings) == 1 and "'city'" in warnings[0] and "memorise" in warnings[0]
    assert "--drop city" in warnings[0]


def test_cli_drop_names_columns_and_says_what_it_dropped(csv, tmp_path, capsys):
    out = tmp_path / "s.json"
    assert cli_main(["schema", "infer", str(csv), "--drop", "job,city", "--drop", "age", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "dropped id: a row id" in printed and "dropped name: a row id" in printed
    assert "warning:" not in printed                        # city, the memorised one, is dropped
    kinds = {c["name"]: c["kind"] for c in json.loads(out.read_text())["columns"]}
    assert kinds == {"id": "drop", "name": "drop", "balance": "numeric", "job": "drop", "city": "drop", "age": "drop"}
    assert cli_main(["schema", "infer", str(csv), "--drop", "cty"]) == 2
    err = capsys.readouterr().err
    assert "--drop cty: no such column (did you mean 'city'?) (columns: id, name, balance, job, city, age, y)" in err


@pytest.mark.parametrize("kw,match", [
    (dict(drop="y"), "--drop y: that is the label column"),
    (dict(drop="age", numeric="age"), "'age' is in both --numeric and --drop"),
])
def test_drop_mistakes_are_clear_errors(csv, kw, match):
    with pytest.raises(ConfigError, match=match):
        infer_schema(csv, **kw)
