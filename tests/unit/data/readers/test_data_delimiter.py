"""Delimiters: `schema infer` lets the header choose among , ; tab | and records the choice, so
later readers read the file alike without a flag; --delimiter wins; a header read as one column
names the likely delimiter in every command's error."""
import json

import numpy as np
import pandas as pd
import pytest

from paramshard.cli.main import main as cli_main
from paramshard.data.errors import DataFormatError
from paramshard.data.features.batch import TabularBatch
from paramshard.data.features.fit import fit_schema
from paramshard.data.features.infer import infer_schema
from paramshard.data.features.input_check import check_inputs
from paramshard.data.readers.frames import file_format, sniff_delimiter, with_delimiter
from paramshard.data.readers.tabular import TabularReader
from paramshard.errors import ConfigError
from paramshard.specs.schema import Column, Format, Label, Schema


def table(n=200, seed=0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"age": rng.integers(18, 90, n), "job": rng.choice(["admin", "services"], n),
                         "tags": ["|".join(rng.choice(list("abc"), 2, replace=False)) for _ in range(n)],
                         "y": rng.integers(0, 2, n)})


@pytest.mark.parametrize("d", [",", ";", "\t", "|"])
def test_the_header_decides_the_delimiter(d):
    lines = [d.join(["a", "b b", "y"]), d.join(["1", "x", "0"]), d.join(["2", "z", "1"])]
    assert sniff_delimiter(lines) == d


def test_bags_in_the_cells_do_not_make_the_delimiter():
    # ';'-separated with '|' bags, and ','-separated with ';' bags: the header and the rows agree on one
    assert sniff_delimiter(["a;tags;y", "1;x|y|z;0", "2;x;1"]) == ";"
    assert sniff_delimiter(["a,tags,y", "1,x;y;z,0", "2,x;y,1"]) == ","
    assert sniff_delimiter(["just_one_column", "1", "2"]) == ","


def test_a_semicolon_csv_is_inferred_recorded_and_read_back_without_a_flag(tmp_path):
    df = table()
    df.to_csv(tmp_path / "train.csv", sep=";", index=False)
    s = infer_schema(tmp_path / "train.csv")          # before issue 32: one column 'age;job;tags;y', no label
    assert (s.format.delimiter, s.format.by_suffix) == (";", False)
    assert {c.name: c.kind for c in s.columns} == {"age": "numeric", "job": "categorical", "tags": "multi"}
    assert s.column("tags").separator == "|"
    again = Schema.from_dict(json.loads(json.dumps(s.to_dict())))
    fitted = fit_schema(again, [tmp_path / "train.csv"])
    rows = TabularBatch.concat(list(TabularReader([tmp_path / "train.csv"], fitted, batch_size=64)))
    assert len(rows) == len(df) and rows.labels.tolist() == df["y"].astype(float).tolist()


def test_a_comma_file_with_semicolon_bags_stays_comma_separated(tmp_path):
    df = table()
    df["tags"] = df["tags"].str.replace("|", ";")
    df.to_csv(tmp_path / "t.txt", index=False)
    s = infer_schema(tmp_path / "t.txt")
    assert s.format.delimiter == "," and s.column("tags").kind == "multi" and s.column("tags").separator == ";"


def test_the_flag_wins(tmp_path):
    table().to_csv(tmp_path / "t.tsv", sep="|", index=False)
    s = infer_schema(tmp_path / "t.tsv", delimiter="|")
    assert s.format.delimiter == "|" and s.format.type == "csv"
    assert with_delimiter(s.format, "tab").delimiter == "\t"
    assert file_format(tmp_path / "x.csv", with_delimiter(Format(), "tab")) == ("text", "\t")
    with pytest.raises(ConfigError, match="--delimiter '::': expected one character"):
        infer_schema(tmp_path / "t.tsv", delimiter="::")


def test_old_schemas_keep_reading_by_suffix(tmp_path):
    # A schema written before delimiters were recorded (no by_suffix): a .tsv file is tab-separated
    # whatever format.delimiter says; one that names ';' is read with ';'.
    assert file_format(tmp_path / "a.tsv", Schema.from_dict(
        {"label": "y", "columns": [{"name": "a"}], "format": {"type": "csv", "delimiter": ","}}).format)[1] == "\t"
    assert file_format(tmp_path / "a.csv", Format(delimiter=";")) == ("text", ";")


def test_a_one_column_header_names_the_likely_delimiter_everywhere(tmp_path):
    table().to_csv(tmp_path / "semi.csv", sep=";", index=False)
    old = Schema(Label("y"), [Column("age", transforms=[]), Column("job", "categorical")], format=Format())
    hint = r"the file looks separated by ';', not ',': pass --delimiter ';'"
    # the app's input check, the readers (app, fit, predict), and infer given the wrong delimiter
    with pytest.raises(ConfigError, match=hint):
        check_inputs([tmp_path / "semi.csv"], old, "train")
    with pytest.raises(DataFormatError, match=r"no column 'y' \(the file has: age;job;tags;y\) \(the header reads as one column: " + hint):
        list(TabularReader([tmp_path / "semi.csv"], old, batch_size=8))
    with pytest.raises(ConfigError, match=hint):
        infer_schema(tmp_path / "semi.csv", delimiter=",")


def test_cli_infer_and_fit_take_the_delimiter(tmp_path, capsys):
    table().to_csv(tmp_path / "t.dat", sep=";", index=False)
    out, fitted = tmp_path / "s.json", tmp_path / "f.json"
    assert cli_main(["schema", "infer", str(tmp_path / "t.dat"), "--delimiter", ";", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["format"]["delimiter"] == ";"
    # fit with an explicit delimiter on a copy written with another: recorded in the fitted schema
    table().to_csv(tmp_path / "t.pipe", sep="|", index=False)
    assert cli_main(["schema", "fit", str(out), str(tmp_path / "t.pipe"), "--delimiter", "|", "-o", str(fitted)]) == 0
    data = json.loads(fitted.read_text())
    assert data["format"]["delimiter"] == "|" and data["rows_fitted"] == 200
