"""The PyTorch twin of benchmarks/public_tables.py (benchmarks/plain_torch_ctr.py) against its
oracle, the CTR app itself: in one process (the app's standalone server) both read the same
rows in the same steps, so every model's epoch losses and test metrics must agree (to float
rounding; the twin's tables are local EmbeddingBags, the app's SparseEmbeddings)."""
import argparse
import json

import numpy as np
import pytest

from paramshard.apps import ctr
from paramshard.data.features.fit import fit_schema
from paramshard.data.features.infer import infer_schema

from tests.unit.benchmark_scripts import import_script
from tests.integration.test_models_training import local_server  # noqa: F401  (the fixture)

twin = import_script("plain_torch_ctr")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("twin")
    rng = np.random.default_rng(0)
    for name, n in (("train", 1200), ("test", 400)):
        colour = rng.choice(["red", "green", "blue", "grey"], n)
        size = rng.normal(0, 1, n)
        logit = (colour == "red") * 1.5 - (colour == "blue") + size
        label = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(int)
        lines = ["colour,size,tags,label"] + [f"{c},{s:.4f},{'a|b' if s > 0 else 'b'},{y}"
                                              for c, s, y in zip(colour, size, label)]
        (d / f"{name}.csv").write_text("\n".join(lines) + "\n")
    fit_schema(infer_schema(d / "train.csv", label="label"), [d / "train.csv"]).save(d / "fitted.json")
    return d


@pytest.mark.parametrize("model", ["lr", "deepfm"])
def test_the_twin_trains_as_the_app_does_in_one_process(local_server, data, model, tmp_path):  # noqa: F811
    common = ["--train", str(data / "train.csv"), "--test", str(data / "test.csv"), "--schema",
              str(data / "fitted.json"), "--model", model, "--epochs", "2", "--batch-size", "64"]
    # Every row trained, no selection: the last epoch is the model in both.
    assert ctr.main(common + ["--valid-fraction", "0", "--json", str(tmp_path / "app.json")]) == 0
    app = json.loads((tmp_path / "app.json").read_text())
    args = twin.parser().parse_args(common + ["--json", str(tmp_path / "twin.json")])
    args.lr, args.table_lr = app["settings"]["lr"], app["settings"]["table_lr"]
    if model != "lr":
        args.dim, args.hidden = app["settings"]["dim"], tuple(app["settings"]["hidden"])
    got = twin.run(args)
    for a, b in zip(app["epochs"], got["epochs"], strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
    assert got["final"]["auc"] == pytest.approx(app["final"]["auc"], abs=1e-6)
    assert got["final"]["logloss"] == pytest.approx(app["final"]["logloss"], rel=1e-5)
