"""Labels at `schema infer`: binary ones are recognised (and which value is 1), anything else is
refused with the reason and what is supported; the schema records label_kind."""
import json

import numpy as np
import pandas as pd
import pytest

from paramshard.data.features.encode import Encoder
from paramshard.data.features.infer import infer_schema
from paramshard.errors import ConfigError
from paramshard.specs.schema import Column, Schema

N = 300


def write(tmp_path, label, name="y.csv"):
    rng = np.random.default_rng(0)
    pd.DataFrame({"x": rng.normal(size=N), "job": rng.choice(["a", "b"], N), "y": label}).to_csv(
        tmp_path / name, index=False)
    return tmp_path / name


def encoded_labels(label, values) -> list[float]:
    """What the readers make of ``values`` in the label column."""
    raw = np.array([str(v) for v in values], object)
    batch, bad = Encoder(Schema(label, [Column("job", "categorical")])).encode(
        {"y": raw, "job": np.array(["a"] * len(raw), object)})
    assert bad == []
    return batch.labels.tolist()


@pytest.mark.parametrize("values,positive,negative", [
    ([0, 1], [], []),
    ([-1, 1], [], []),
    (["yes", "no"], ["yes"], ["no"]),            # yes is 1 though it is the commoner value here
    (["True", "False"], ["True"], ["False"]),
    ([1, 2], ["2"], ["1"]),                       # two numbers: the larger is 1
    (["<=50K", ">50K"], [">50K"], ["<=50K"]),     # two other values: the rarer is 1
])
def test_binary_labels_are_recognised(tmp_path, values, positive, negative):
    label = np.array(values, dtype=object)[(np.arange(N) % 3 == 0).astype(int)]     # values[0] on 2/3 of rows
    s = infer_schema(write(tmp_path, label))
    assert (s.label.positive, s.label.negative, s.label_kind) == (positive, negative, "binary")
    assert encoded_labels(s.label, values) == [float(str(v) in positive if positive else v == 1) for v in values]


@pytest.mark.parametrize("label,what", [
    (np.round(np.random.default_rng(1).lognormal(3, 1, N), 2), "a continuous label"),   # a price
    (np.arange(N) % 5, r"a multi-class label \(5 classes"),
    (np.array(["red", "green", "blue"], object)[np.arange(N) % 3], r"a multi-class label \(3 distinct values"),
    (np.array(["yes"] * N, object), r"one value only \(yes\)"),
])
def test_other_labels_are_refused_at_infer_with_the_reason(tmp_path, label, what):
    # Before issue 32 a continuous or 0..4 label was accepted and the app failed on its first row.
    with pytest.raises(ConfigError, match=rf"label column 'y' .*{what}.*only binary labels are supported by the CTR "
                                          r"app: 0/1 \(or -1/\+1\) numbers, or a column with two distinct values"):
        infer_schema(write(tmp_path, label))


def test_label_kind_is_recorded_and_older_schemas_are_binary(tmp_path):
    s = infer_schema(write(tmp_path, np.arange(N) % 2))
    data = json.loads(json.dumps(s.to_dict()))
    assert data["label_kind"] == "binary"
    del data["label_kind"]
    assert Schema.from_dict(data).label_kind == "binary"
    data["label_kind"] = "regression"
    with pytest.raises(ConfigError, match="label_kind 'regression': this version supports only 'binary' labels"):
        Schema.from_dict(data)


def test_a_label_guessed_from_its_name_says_so_when_refused(tmp_path):
    rng = np.random.default_rng(0)
    pd.DataFrame({"x": rng.normal(size=N), "class": rng.choice(["Dresses", "Knits", "Blouses"], N),
                  "recommended": rng.integers(0, 2, N)}).to_csv(tmp_path / "c.csv", index=False)
    with pytest.raises(ConfigError, match=r"label column 'class' has a multi-class label .*\(the label 'class' was a "
                                          r"guess from its name: pass --label COLUMN"):
        infer_schema(tmp_path / "c.csv")
    assert infer_schema(tmp_path / "c.csv", label="recommended").column("class").kind == "categorical"
