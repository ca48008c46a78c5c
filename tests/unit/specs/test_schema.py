"""Schema transforms against pandas / scikit-learn, hashing stability, infer, fit, files."""

import numpy as np
import pandas as pd
import pytest
from sklearn.preprocessing import StandardScaler

from paramshard.data.features.batch import TabularBatch
from paramshard.data.features.encode import Encoder
from paramshard.data.features.fit import fit_schema
from paramshard.data.features.hashing import MISSING_TOKEN, feature_id, feature_ids
from paramshard.data.features.infer import infer_schema
from paramshard.specs.schema import Column, Label, Schema
from paramshard.data.readers.tabular import TabularReader
from paramshard.errors import ConfigError


def table(n=1000, seed=0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    amount = np.round(rng.lognormal(3, 1.5, n), 2)
    return pd.DataFrame({
        "age": rng.integers(18, 90, n).astype(float),
        "amount": amount,
        "city": rng.choice(["Paris", "Oslo", "Lima", "?"], n, p=[0.5, 0.3, 0.15, 0.05]),
        "tags": ["|".join(rng.choice(["a", "b", "c", "d"], rng.integers(1, 4), replace=False)) for _ in range(n)],
        "const": "x",
        "clicked": rng.choice(["yes", "no"], n, p=[0.3, 0.7]),
    })


def write_csv(df, path, missing_age=()):
    df = df.copy()
    df["age"] = df["age"].astype(object)
    for i in missing_age:
        df.loc[i, "age"] = "?"
    df.to_csv(path, index=False)
    return path


def all_rows(reader) -> TabularBatch:
    return TabularBatch.concat(list(reader))


def test_standardize_equals_sklearn_standard_scaler_and_log_is_signed(tmp_path):
    df = table()
    path = write_csv(df, tmp_path / "t.csv")
    schema = Schema(Label("clicked", ["yes"], ["no"]),
                    [Column("age", transforms=["standardize"]), Column("amount", transforms=["log", "standardize"]),
                     Column("city", "categorical"), Column("tags", "drop"), Column("const", "drop")])
    fitted = fit_schema(schema, [path])
    got = all_rows(TabularReader([path], fitted, 100)).dense
    want = StandardScaler().fit_transform(np.stack([df["age"], np.log1p(df["amount"])], axis=1))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert fitted.column("age").stats["mean"] == pytest.approx(df["age"].mean())
    from paramshard.data.features.encode import signed_log
    np.testing.assert_allclose(signed_log(np.array([-3.0, 0.0, 3.0])), [-np.log1p(3), 0, np.log1p(3)])


def test_bucketize_equals_pandas_qcut(tmp_path):
    df = table(2000)
    path = write_csv(df, tmp_path / "t.csv")
    schema = Schema(Label("clicked", ["yes"], ["no"]),
                    [Column("amount", bucketize=10, dense=False), Column("age", "drop"), Column("city", "drop"),
                     Column("tags", "drop"), Column("const", "drop")])
    fitted = fit_schema(schema, [path])
    ids = all_rows(TabularReader([path], fitted, 500)).ids[:, 0]
    want = pd.qcut(df["amount"], 10, labels=False, duplicates="drop").to_numpy()
    bucket_of = {feature_id("amount", f"#{k}"): k for k in range(10)}
    np.testing.assert_array_equal([bucket_of[i] for i in ids], want)


def test_missing_values_get_an_indicator_and_the_mean_and_categories_their_own_id(tmp_path):
    df = table(200)
    path = write_csv(df, tmp_path / "t.csv", missing_age=(3, 7))
    schema = Schema(Label("clicked", ["yes"], ["no"]),
                    [Column("age", transforms=["standardize"], missing_indicator=True), Column("city", "categorical"),
                     Column("amount", "drop"), Column("tags", "drop"), Column("const", "drop")])
    b = all_rows(TabularReader([path], fit_schema(schema, [path]), 64))
    assert b.dense[3].tolist() == [0.0, 1.0] and b.dense[7].tolist() == [0.0, 1.0]   # mean, indicator
    assert b.dense[:, 1].sum() == 2
    assert (b.ids[(df["city"] == "?").to_numpy(), 0] == feature_id("city", MISSING_TOKEN)).all()
    assert b.labels.tolist() == (df["clicked"] == "yes").astype(np.float32).tolist()


def test_multi_valued_column_gives_bags_weighted_to_a_mean(tmp_path):
    df = table(50)
    path = write_csv(df, tmp_path / "t.csv")
    schema = Schema(Label("clicked", ["yes"], ["no"]),
                    [Column("tags", "multi", separator="|"), Column("city", "categorical"), Column("age", "drop"),
                     Column("amount", "drop"), Column("const", "drop")])
    b = all_rows(TabularReader([path], schema, 16))
    assert b.offsets is not None and len(b.offsets) == 2 * len(df)
    ends = np.r_[b.offsets[1:], len(b.ids)]
    for row, tags in enumerate(df["tags"]):
        start, stop = b.offsets[2 * row], ends[2 * row]
        assert sorted(b.ids[start:stop].tolist()) == sorted(feature_id("tags", t) for t in tags.split("|"))
        np.testing.assert_allclose(b.weights[start:stop], 1 / len(tags.split("|")))


def test_min_count_maps_rare_values_to_one_id(tmp_path):
    df = pd.DataFrame({"c": ["a"] * 5 + ["b"] * 2 + ["z"], "y": [0, 1] * 4})
    df.to_csv(tmp_path / "t.csv", index=False)
    schema = fit_schema(Schema(Label("y"), [Column("c", "categorical", min_count=3)]), [tmp_path / "t.csv"])
    assert schema.column("c").stats["vocabulary"] == {"a": 5}
    ids = all_rows(TabularReader([tmp_path / "t.csv"], schema, 8)).ids[:, 0]
    assert len(set(ids[:5])) == 1 and ids[5] == ids[6] == ids[7] != ids[0]


def test_infer_guesses_kinds_label_and_drops_constants(tmp_path):
    df = table(500)
    path = write_csv(df, tmp_path / "t.csv", missing_age=(1,))
    s = infer_schema(path)               # "clicked" is found by name
    assert s.label.column == "clicked" and s.label.positive == ["yes"] and s.label.negative == ["no"]
    kinds = {c.name: c.kind for c in s.columns}
    assert kinds == {"age": "numeric", "amount": "numeric", "city": "categorical", "tags": "multi", "const": "drop"}
    assert s.column("amount").transforms == ["log", "standardize"]       # heavy-tailed
    assert s.column("age").transforms == ["standardize"] and s.column("age").missing_indicator
    assert s.column("age").bucketize == 10 and s.num_fields == 4      # city, tags + 2 bucketized numbers
    with pytest.raises(ConfigError, match="--label"):
        infer_schema(path, label="nope")


def test_schema_files_round_trip_and_bad_schemas_are_clear_errors(tmp_path):
    s = infer_schema(write_csv(table(100), tmp_path / "t.csv"))
    for name in ("s.json", "s.yaml"):
        s.save(tmp_path / name)
        assert Schema.load(tmp_path / name) == s
    with pytest.raises(ConfigError, match="unknown transform 'sqrt'"):
        Schema(Label("y"), [Column("a", transforms=["sqrt"])])
    with pytest.raises(ConfigError, match="standardize last"):
        Schema(Label("y"), [Column("a", transforms=["standardize", "log"])])
    with pytest.raises(ConfigError, match="unknown key 'kindd'"):
        Schema.from_dict({"label": "y", "columns": [{"name": "a", "kindd": "numeric"}]})
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        Schema.load(tmp_path / "bad.json")
    with pytest.raises(ConfigError, match="schema fit"):
        TabularReader([tmp_path / "t.csv"], s, 10)       # standardize needs statistics


def test_hashing_is_the_documented_blake2b_and_fields_are_distinct():
    """The same ids in every process: tests/integration/test_hash_seeds.py runs this in processes
    with other PYTHONHASHSEEDs."""
    here = feature_ids("city", np.array(["Paris", "Oslo", "Paris", ""], dtype=object)).tolist()
    assert here[0] == here[2] != here[1]
    assert feature_id("city", "Paris") != feature_id("town", "Paris")
    import hashlib      # the documented definition: BLAKE2b-64 of "field\x1fvalue", little-endian, signed
    assert here[1] == int.from_bytes(hashlib.blake2b(b"city\x1fOslo", digest_size=8).digest(), "little", signed=True)
