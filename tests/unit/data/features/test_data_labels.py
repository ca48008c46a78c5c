"""Labels at `schema infer`: binary ones are recognised (and which value is 1), a real-valued one is a
regression, several binary ones (--label a,b) a multi-task schema; anything else is refused with the
reason and what is supported; the schema records label_kind (issue 32)."""
import json

import numpy as np
import pandas as pd
import pytest

from paramshard.data.features.encode import Encoder
from paramshard.data.features.fit import fit_schema
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
    (np.arange(N) % 5, r"a multi-class label \(5 classes.*pass --label-kind regression"),
    (np.array(["red", "green", "blue"], object)[np.arange(N) % 3], r"a multi-class label \(3 distinct values"),
    (np.array(["yes"] * N, object), r"one value only \(yes\)"),
])
def test_other_labels_are_refused_at_infer_with_the_reason(tmp_path, label, what):
    # Before issue 32 a continuous or 0..4 label was accepted and the app failed on its first row.
    with pytest.raises(ConfigError, match=rf"label column 'y' .*{what}.*the CTR app supports binary labels: 0/1 "
                                          r"\(or -1/\+1\) numbers, or a column with two distinct values.*real-valued "
                                          r"labels \(regression.*several binary labels \(multi-task, --label a,b\)"):
        infer_schema(write(tmp_path, label))


def test_a_continuous_label_is_a_regression_fitted_and_encoded_as_its_number(tmp_path):
    """Many distinct real values (a price): label_kind regression; `schema fit` writes the
    label's mean and std (population, as numpy's); the encoder gives the number itself."""
    price = np.round(np.random.default_rng(1).lognormal(3, 1, N), 2)
    path = write(tmp_path, price)
    s = infer_schema(path)
    assert (s.label_kind, s.label.positive, s.label.negative, s.unfitted()[:1]) == ("regression", [], [], ["y"])
    fitted = fit_schema(s, path)
    assert fitted.label.stats["mean"] == pytest.approx(price.mean(), rel=1e-12)
    assert fitted.label.stats["std"] == pytest.approx(price.std(), rel=1e-12)
    again = Schema.from_dict(json.loads(json.dumps(fitted.to_dict())))
    assert again.label.stats == fitted.label.stats and again.unfitted() == []
    batch, bad = Encoder(again).encode({"y": np.array(["1.5", "x", "7"], object), "x": np.array(["0"] * 3, object),
                                        "job": np.array(["a"] * 3, object)})
    assert batch.labels.tolist() == [1.5, 7.0]
    assert bad == [(1, "label column 'y' is not a number: 'x' (a regression label)")]
    # Whole numbers of many values (a count) are a quantity too.
    assert infer_schema(write(tmp_path, np.arange(N) % 97)).label_kind == "regression"


def test_label_kind_settles_an_ambiguous_guess(tmp_path):
    rating = write(tmp_path, np.arange(N) % 6)           # 0..5: classes, unless told it is a quantity
    assert infer_schema(rating, label_kind="regression").label_kind == "regression"
    with pytest.raises(ConfigError, match=r"is a continuous label .* not binary as --label-kind binary says"):
        infer_schema(write(tmp_path, np.random.default_rng(2).normal(size=N)), label_kind="binary")
    with pytest.raises(ConfigError, match=r"is not a number \(e.g. 'a'\): --label-kind regression needs a numeric"):
        infer_schema(write(tmp_path, np.array(["a", "b"], object)[np.arange(N) % 2]), label_kind="regression")


def test_several_binary_labels_are_a_multitask_schema(tmp_path):
    rng = np.random.default_rng(3)
    click = rng.integers(0, 2, N)
    pd.DataFrame({"x": rng.normal(size=N), "job": rng.choice(["a", "b"], N), "click": click,
                  "buy": np.where(click == 1, rng.choice(["yes", "no"], N), "no"),
                  "price": rng.normal(size=N)}).to_csv(tmp_path / "m.csv", index=False)
    s = infer_schema(tmp_path / "m.csv", label="click,buy")
    assert (s.label_kind, s.label_names, s.label.column) == ("multitask", ["click", "buy"], "click")
    assert s.tasks[1].positive == ["yes"] and [c.name for c in s.columns] == ["x", "job", "price"]
    data = json.loads(json.dumps(s.to_dict()))
    assert [x["column"] for x in data["labels"]] == ["click", "buy"] and Schema.from_dict(data).label_names == \
        ["click", "buy"]
    batch, bad = Encoder(fit_schema(s, tmp_path / "m.csv")).encode(
        {"click": np.array(["1", "0", "1"], object), "buy": np.array(["yes", "no", "?"], object),
         "x": np.array(["0"] * 3, object), "job": np.array(["a"] * 3, object), "price": np.array(["1"] * 3, object)})
    assert batch.labels.tolist() == [[1.0, 1.0], [0.0, 0.0]] and bad == [(2, "label column 'buy' is missing")]
    with pytest.raises(ConfigError, match=r"label column 'price' is a continuous label .*one of the multi-task "
                                          r"labels click,price: each must be binary"):
        infer_schema(tmp_path / "m.csv", label="click,price")


def test_label_kind_is_recorded_and_older_schemas_are_binary(tmp_path):
    s = infer_schema(write(tmp_path, np.arange(N) % 2))
    data = json.loads(json.dumps(s.to_dict()))
    assert data["label_kind"] == "binary"
    assert "labels" not in data and "stats" not in data["label"]      # a single-label file as before
    del data["label_kind"]
    assert Schema.from_dict(data).label_kind == "binary"
    data["label_kind"] = "ordinal"
    with pytest.raises(ConfigError, match="label_kind 'ordinal': this version supports 'binary', 'regression', "
                                          "'multitask' labels"):
        Schema.from_dict(data)
    data["label_kind"] = "multitask"
    with pytest.raises(ConfigError, match="label_kind 'multitask' needs two or more binary labels in 'labels'"):
        Schema.from_dict(data)


def test_a_label_guessed_from_its_name_says_so_when_refused(tmp_path):
    rng = np.random.default_rng(0)
    pd.DataFrame({"x": rng.normal(size=N), "class": rng.choice(["Dresses", "Knits", "Blouses"], N),
                  "recommended": rng.integers(0, 2, N)}).to_csv(tmp_path / "c.csv", index=False)
    with pytest.raises(ConfigError, match=r"label column 'class' has a multi-class label .*\(the label 'class' was a "
                                          r"guess from its name: pass --label COLUMN"):
        infer_schema(tmp_path / "c.csv")
    assert infer_schema(tmp_path / "c.csv", label="recommended").column("class").kind == "categorical"


def test_the_cli_takes_label_kind_and_shows_the_labels(tmp_path, capsys):
    from paramshard.cli.main import main as cli_main
    path = write(tmp_path, np.arange(N) % 6)
    assert cli_main(["schema", "infer", str(path), "--label-kind", "regression", "-o", str(tmp_path / "s.json")]) == 0
    assert "wrote" in capsys.readouterr().out and Schema.load(tmp_path / "s.json").label_kind == "regression"
    assert cli_main(["schema", "fit", str(tmp_path / "s.json"), str(path), "-o", str(tmp_path / "f.json")]) == 0
    assert f"label y (regression: mean 2.5 std {np.std(np.arange(N) % 6):.4g})" in capsys.readouterr().out
