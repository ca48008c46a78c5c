"""serving/fast_rows.py: the fast path's batch equals the schema Encoder's (the oracle:
``encode(from_rows(rows))``, what `paramshard predict` encodes) array for array and bit for bit,
over random schemas (every column kind: numeric with log / standardize / buckets / missing
indicator / dense off, categorical with and without min_count, multi-valued as text and lists, a
behaviour sequence, dropped columns) and random rows (missing keys, nulls, missing-value text,
unknown and rare categories, numbers as JSON numbers and as text, -0.0, NaN and Infinity, big
integers, empty bags, refused values); a request refused is refused with the same message; warm
caches (a request sent again) answer the same; valid requests really take the fast path."""
import json
import math

import numpy as np
import pytest

from paramshard.data import Column, Label, Schema
from paramshard.serving.rows import BadRequest, RowEncoder

NUMERIC = ["3", " 4.5 ", "-2", "1e3", "0.1", "NA", "", "?", " ", "nan", 3, 3.0, -0.0, 0, 0.0, 1.5, -7, 0.1,
           123456789, 1e-300, None]
CATEGORICAL = ["a", " a ", "b", "c", "NA", "", "unseen", "x y", 1, 1.0, -0.0, 0, 2.5, 1e20, None]
MULTI = ["a|b", "a;b", "b|a|a", "a||b", ["a", "b"], ["a", 1, 1.0], ["c"], [], "", "NA", None, 5, 5.0, "z", ["NA", "a"]]
REFUSED = [True, {"a": 1}, [[1]], ["x", None]]      # a boolean, an object, a nested list, a null in a bag
ODD = [float("nan"), float("inf"), 2 ** 60, "9007199254740993", "abc", -0.0]   # odd but answered (or refused alike)


def random_schema(g) -> Schema:
    columns = []
    for i in range(int(g.integers(1, 4))):
        transforms = [[], ["log"], ["standardize"], ["log", "standardize"]][int(g.integers(0, 4))]
        buckets = int(g.choice([0, 0, 2, 5]))
        stats = {"mean": float(g.normal()), "std": float(g.choice([0.0, abs(g.normal()) + 0.1]))}
        if buckets:
            stats["edges"] = sorted(g.normal(size=buckets + 1).round(2).tolist())
        columns.append(Column(f"n{i}", transforms=transforms, bucketize=buckets, dense=bool(not buckets or g.random() < .5),
                              missing_indicator=bool(g.random() < .5), stats=stats if g.random() < .8 or buckets or
                              "standardize" in transforms else None))
    for i in range(int(g.integers(1, 4))):
        rare = g.random() < .4
        columns.append(Column(f"c{i}", "categorical", min_count=2 if rare else 1,
                              stats={"vocabulary": ["a", "b", "1", "NA"]} if rare else None))
    for i in range(int(g.integers(0, 3))):
        rare = g.random() < .3
        columns.append(Column(f"m{i}", "multi", separator=str(g.choice(["|", ";"])), min_count=2 if rare else 1,
                              list_column=bool(g.random() < .3), sequence_of="c0" if g.random() < .4 else "",
                              stats={"vocabulary": ["a", "z"]} if rare else None))
    if g.random() < .5:
        columns.append(Column("dropped", "drop"))
    order = g.permutation(len(columns))
    return Schema(Label("y"), [columns[k] for k in order])


def random_rows(g, schema: Schema, n: int, odd: float, refused: float, absent: float = .1) -> list[dict]:
    pools = {"numeric": NUMERIC, "categorical": CATEGORICAL, "multi": MULTI, "drop": ["x", 1]}
    rows = []
    for _ in range(n):
        row = {"y": 1, "other": "ignored"}
        for c in schema.columns:
            if g.random() < absent:
                continue                          # an absent key: a missing value
            pool = pools[c.kind]
            value = pool[int(g.integers(0, len(pool)))]
            if g.random() < odd:
                value = ODD[int(g.integers(0, len(ODD)))]
            if g.random() < refused:
                value = REFUSED[int(g.integers(0, len(REFUSED)))]
            row[c.name] = value
        rows.append(row)
    return rows


def same(fast, oracle) -> None:
    assert fast.num_fields == oracle.num_fields
    for field in ("labels", "dense", "ids", "offsets", "weights"):
        a, b = getattr(fast, field), getattr(oracle, field)
        if a is None or b is None:
            assert a is None and b is None, field
            continue
        assert a.dtype == b.dtype and a.shape == b.shape, field
        assert a.tobytes() == b.tobytes(), field           # bit for bit (NaN labels, -0.0 included)


def outcome(encode, *args):
    try:
        return encode(*args), None
    except BadRequest as exc:
        return None, str(exc)


def check(encoder: RowEncoder, rows) -> bool:
    """The fast path's answer (twice: cold, then from its caches) equals the oracle's; whether it took it."""
    expected, why = outcome(lambda r: encoder.encode(encoder.from_rows(r)), rows)
    fallbacks = encoder.fast.fallbacks
    for _ in range(2):
        got, got_why = outcome(encoder.batch_of_rows, json.loads(json.dumps(rows)))     # the JSON a client sends
        assert got_why == why
        if expected is not None:
            same(got, expected)
    return encoder.fast.fallbacks == fallbacks


@pytest.mark.parametrize("seed", range(12))
def test_fast_path_equals_the_encoder(seed):
    g = np.random.default_rng(seed)
    schema = random_schema(g)
    encoder = RowEncoder.of_schema(schema)
    took = [check(encoder, random_rows(g, schema, int(g.integers(1, 12)), odd=0.0, refused=0.0)) for _ in range(3)]
    # Every row with every column (the usual request: its cells are read a row at a time) too.
    took += [check(encoder, random_rows(g, schema, int(g.integers(1, 12)), 0.0, 0.0, absent=0.0)) for _ in range(2)]
    assert all(took), "plain requests must take the fast path"
    for odd, refused in ((0.15, 0.0), (0.0, 0.05)):
        check(encoder, random_rows(g, schema, int(g.integers(1, 12)), odd, refused))


def test_columns_form_and_request_shapes():
    g = np.random.default_rng(99)
    schema = random_schema(g)
    encoder = RowEncoder.of_schema(schema)
    rows = random_rows(g, schema, 7, 0.0, 0.0)
    columns = {c.name: [r.get(c.name) for r in rows] for c in schema.columns}
    del columns[schema.columns[0].name]                          # an absent column: every value missing
    expected = encoder.encode(encoder.from_columns(columns))
    before = encoder.fast.fast
    same(encoder.batch_of_columns(columns), expected)
    assert encoder.fast.fast == before + 1
    for bad in ([], "rows", [1], [{}] * 10_001):
        _, why = outcome(lambda r: encoder.encode(encoder.from_rows(r)), bad)
        assert outcome(encoder.batch_of_rows, bad)[1] == why and why
    for bad in ({}, {"x": [1], "y": [1, 2]}, {"x": 3}, []):
        _, why = outcome(lambda c: encoder.encode(encoder.from_columns(c)), bad)
        assert outcome(encoder.batch_of_columns, bad)[1] == why and why


def test_keys_that_python_calls_equal_and_the_encoder_does_not():
    """-0.0 == 0 in a dict, but a numeric column parses them apart; 1 == 1.0, but a multi-valued
    cell's number is its text ("1" vs "1.0"); True == 1, but a boolean is refused."""
    schema = Schema(Label("y"), [Column("n"), Column("m", "multi"), Column("c", "categorical")])
    encoder = RowEncoder.of_schema(schema)
    for rows in ([{"n": 0, "m": 1, "c": 1}], [{"n": -0.0, "m": 1.0, "c": True}], [{"n": -0.0, "m": 1.0, "c": 1}],
                 [{"n": 0.0, "m": [1], "c": -0.0}], [{"n": 0, "m": [True], "c": 0}]):
        check(encoder, rows)
    dense = encoder.batch_of_rows([{"n": -0.0}, {"n": 0}]).dense[:, 0]
    assert [math.copysign(1.0, float(v)) for v in dense] == [-1.0, 1.0]     # not one cached zero


def test_a_one_column_schema_and_rows_without_some_columns():
    """One column (its cells read by key, not as a row's tuple) and rows lacking a column (a missing
    value) both equal the Encoder's batch."""
    for schema in (Schema(Label("y"), [Column("c", "categorical")]),
                   Schema(Label("y"), [Column("n"), Column("c", "categorical")])):
        encoder = RowEncoder.of_schema(schema)
        assert check(encoder, [{"c": "a", "n": "1"}, {"c": "b"}, {"n": 2}, {}])
        assert check(encoder, [{"c": "a", "n": "1"}, {"c": "b", "n": 3}])
