"""data/features/infer.py and `paramshard schema infer|show`: ids become categories, the overrides,
doubtful guesses marked, and files without data rows named as such."""
import json

import numpy as np
import pandas as pd
import pytest

from paramshard.cli.main import main as cli_main
from paramshard.data.errors import DataFormatError
from paramshard.data.features.id_columns import ambiguity
from paramshard.data.features.infer import infer_schema
from paramshard.errors import ConfigError


def movielens(n=3000, seed=0) -> pd.DataFrame:
    """A MovieLens-like table (ratings joined with users and movies), plus columns that must stay numbers."""
    rng = np.random.default_rng(seed)
    pop = 1 / np.arange(1, 1683) ** 0.8
    movies = (rng.permutation(1682) + 1)[rng.choice(1682, n, p=pop / pop.sum())]
    return pd.DataFrame({
        "user_id": rng.integers(1, 944, n), "movie_id": movies, "age": rng.integers(7, 74, n),
        "gender": rng.choice(["M", "F"], n), "occupation": rng.choice(["writer", "doctor", "student"], n),
        "zip_code": rng.integers(10000, 99999, n),
        "genres": ["|".join(rng.choice(["Drama", "Comedy", "War"], 2, replace=False)) for _ in range(n)],
        "paid": np.round(rng.lognormal(3, 1, n), 2),          # money: a name ending in "id" is not an id
        "valid": rng.integers(0, 2, n),
        "width": rng.normal(10, 2, n).round(3),
        "rating": rng.integers(1, 6, n), "hours_per_week": rng.integers(1, 100, n),
        "fnlwgt": np.round(rng.lognormal(12, 0.3, n)).astype(int),   # whole numbers spread thin, evenly
        "spend": np.round(rng.lognormal(8, 2, n)).astype(int),      # ... and heavy-tailed: an amount
        "store": rng.integers(0, 400, n),                             # ids with no id name
        "label": rng.integers(0, 2, n)})


@pytest.fixture
def ml_csv(tmp_path):
    path = tmp_path / "ratings.csv"
    movielens().to_csv(path, index=False)
    return path


def kinds(schema) -> dict:
    return {c.name: c.kind for c in schema.columns}


def test_movielens_ids_are_categorical_and_quantities_numeric(ml_csv):
    s = infer_schema(ml_csv)
    assert kinds(s) == {"user_id": "categorical", "movie_id": "categorical", "age": "numeric", "gender": "categorical",
                        "occupation": "categorical", "zip_code": "categorical", "genres": "multi", "paid": "numeric",
                        "valid": "numeric", "width": "numeric", "rating": "numeric", "hours_per_week": "numeric",
                        "fnlwgt": "numeric", "spend": "numeric", "store": "categorical"}
    assert "'id'" in s.column("user_id").note and "'code'" in s.column("zip_code").note
    assert "sequential ids" in s.column("store").note
    # a guess by values alone, and whole numbers with many values kept numeric, are doubtful; the rest are not
    doubtful = {c.name: ambiguity(c) for c in s.columns if ambiguity(c)}
    assert set(doubtful) == {"store", "fnlwgt"}
    assert "--numeric store" in doubtful["store"] and "--categorical fnlwgt" in doubtful["fnlwgt"]


def test_the_same_ids_from_parquet_as_integers(ml_csv, tmp_path):
    pd.read_csv(ml_csv).to_parquet(tmp_path / "r.parquet")
    assert kinds(infer_schema(tmp_path / "r.parquet")) == kinds(infer_schema(ml_csv))


def test_an_id_named_column_with_fractional_numbers_stays_numeric_and_doubtful(tmp_path):
    df = pd.DataFrame({"score_id": np.random.default_rng(0).normal(size=200), "label": [0, 1] * 100})
    df.to_csv(tmp_path / "f.csv", index=False)
    c = infer_schema(tmp_path / "f.csv").column("score_id")
    assert c.kind == "numeric" and "fractional" in ambiguity(c)


def test_a_row_id_with_every_value_distinct_is_dropped(tmp_path):
    pd.DataFrame({"row_id": np.arange(500), "x": np.arange(500) % 7, "label": [0, 1] * 250}).to_csv(
        tmp_path / "r.csv", index=False)
    c = infer_schema(tmp_path / "r.csv").column("row_id")
    assert c.kind == "drop" and "a row id" in c.note and "--categorical row_id" in c.note


def test_overrides_set_the_kind_and_say_so_in_the_note(ml_csv):
    s = infer_schema(ml_csv, categorical="rating,hours_per_week", numeric=["user_id"])
    assert kinds(s)["rating"] == kinds(s)["hours_per_week"] == "categorical"
    assert "--categorical on the command line" in s.column("rating").note
    assert "the guess was numeric" in s.column("rating").note and not ambiguity(s.column("rating"))
    user = s.column("user_id")
    assert user.kind == "numeric" and user.transforms == ["standardize"] and user.bucketize == 10
    assert "--numeric on the command line" in user.note and "the guess was categorical" in user.note
    assert "--numeric made it numeric" in ambiguity(user)
    s = infer_schema(ml_csv, categorical=["fnlwgt"])        # settling a doubt removes it
    assert s.column("fnlwgt").kind == "categorical" and not ambiguity(s.column("fnlwgt"))


@pytest.mark.parametrize("kw,match", [
    (dict(categorical="moive_id"), r"--categorical moive_id: no such column \(did you mean 'movie_id'\?\)"),
    (dict(numeric="Rating"), r"did you mean 'rating'\?"),
    (dict(categorical="nothing_like_it"), r"no such column \(columns: user_id, "),
    (dict(categorical="label"), "that is the label column"),
    (dict(categorical="age", numeric="age"), "both --categorical and --numeric"),
    (dict(numeric="gender"), r"--numeric gender: its values are not all numbers \(e.g. 'M'|'F'\)"),
])
def test_override_mistakes_are_clear_errors(ml_csv, kw, match):
    with pytest.raises(ConfigError, match=match):
        infer_schema(ml_csv, **kw)


def test_a_typod_label_gets_a_suggestion(ml_csv):
    with pytest.raises(ConfigError, match=r"no column 'lable' \(did you mean 'label'\?\)"):
        infer_schema(ml_csv, label="lable")


def test_a_header_only_file_says_so_instead_of_every_column_dropped(tmp_path):
    (tmp_path / "h.csv").write_text("user_id,movie_id,label\n")
    with pytest.raises(ConfigError, match=r"h.csv has a header \(user_id, movie_id, label\) but no data rows"):
        infer_schema(tmp_path / "h.csv")
    pd.DataFrame({"a": pd.Series([], dtype=int), "label": pd.Series([], dtype=int)}).to_parquet(tmp_path / "h.parquet")
    with pytest.raises(ConfigError, match="but no data rows"):
        infer_schema(tmp_path / "h.parquet")


def test_empty_and_unreadable_files(tmp_path):
    (tmp_path / "e.csv").write_bytes(b"")
    with pytest.raises(ConfigError, match="e.csv: empty file, nothing to infer a schema from"):
        infer_schema(tmp_path / "e.csv")
    (tmp_path / "e.parquet").write_bytes(b"")
    with pytest.raises(DataFormatError, match="e.parquet: is not a readable Parquet file"):
        infer_schema(tmp_path / "e.parquet")
    (tmp_path / "bad.csv").write_text("a,b,label\n1;2;3\n4;5;6\n")
    with pytest.raises(ConfigError, match=r"none of the first rows could be read \(line 2: expected 3 columns"):
        infer_schema(tmp_path / "bad.csv")


def test_cli_infer_takes_the_overrides_and_show_marks_doubtful_columns(ml_csv, tmp_path, capsys):
    out = tmp_path / "s.json"
    assert cli_main(["schema", "infer", str(ml_csv), "-o", str(out), "--categorical", "rating",
                     "--numeric", "movie_id,store", "--categorical", "hours_per_week"]) == 0
    assert "check movie_id, fnlwgt" in capsys.readouterr().out
    columns = {c["name"]: c for c in json.loads(out.read_text())["columns"]}
    assert columns["rating"]["kind"] == columns["hours_per_week"]["kind"] == "categorical"
    assert columns["movie_id"]["kind"] == columns["store"]["kind"] == "numeric"
    assert cli_main(["schema", "show", str(out)]) == 0
    lines = {line.split()[1] if line.startswith("?") else line.split()[0]: line
             for line in capsys.readouterr().out.splitlines()[1:-1]}
    marked = {name for name, line in lines.items() if line.startswith("?")}
    assert marked == {"movie_id", "fnlwgt"}
    assert "ambiguous: its name ends in the word 'id', yet --numeric made it numeric" in lines["movie_id"]
    assert lines["movie_id"].count("ambiguous:") == 1 and lines["user_id"].startswith("  user_id ")
    assert cli_main(["schema", "infer", str(ml_csv), "--numeric", "movie"]) == 2
    assert "--numeric movie: no such column (did you mean 'movie_id'?)" in capsys.readouterr().err
