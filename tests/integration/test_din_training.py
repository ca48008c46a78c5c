"""DIN trained by the CTR app in one process (its standalone server, SparseEmbedding tables) on a
table made for it: the label is whether the candidate item is in the user's history (10% of the
labels flipped). A model that compares the history item by item with the candidate, in one id
space, sees it; DeepFM has only the dot product of the candidate with the history's mean. Oracle:
the Bayes classifier (in history or not) has AUC 0.9 exactly (below); DIN comes near it and
clearly above DeepFM, both at the same rates (the larger ones a 6k-row table needs in 6 epochs). Its --export scored by `paramshard
predict` and its TorchScript export (inference/portable.py) give the app's test metrics."""
import json

import numpy as np
import pytest
import torch

from paramshard.apps import ctr
from paramshard.data import TabularReader
from paramshard.data.features.infer import infer_schema
from paramshard.inference.portable import export_portable
from paramshard.inference.scoring import predict_files
from paramshard.specs.schema import Schema

from tests.integration.test_models_training import local_server  # noqa: F401  (the fixture)

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
ITEMS, FLIP = 60, 0.1
# The Bayes classifier's AUC: P(in history) = 1/2, scores 1 (in) or 0 (not); a positive is "in" with
# probability 0.9, a negative "not" with 0.9: P(pos > neg) + P(tie) / 2 = 0.81 + (0.09 + 0.01) / 2.
ORACLE_AUC = (1 - FLIP) ** 2 + ((1 - FLIP) * FLIP + FLIP * (1 - FLIP)) / 2


def table(path, rows, rng):
    lines = ["user_age,item_id,hist_item_ids,click"]
    for _ in range(rows):
        history = rng.choice(ITEMS, rng.integers(3, 9), replace=False)
        inside = rng.random() < 0.5
        item = rng.choice(history) if inside else rng.choice(np.setdiff1d(np.arange(ITEMS), history))
        click = int(inside) ^ int(rng.random() < FLIP)
        lines.append(f"{rng.integers(18, 70)},{item},{'|'.join(map(str, history))},{click}")
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("din")
    rng = np.random.default_rng(0)
    table(d / "train.csv", 6000, rng)
    table(d / "test.csv", 1500, rng)
    schema = infer_schema(d / "train.csv", label="click", sequence=["hist_item_ids:item_id"])
    fields = [c.name for c in schema.fields]
    assert [(fields[s], fields[c]) for s, c in schema.sequences] == [("hist_item_ids", "item_id")]
    schema.save(d / "schema.json")
    return d


def run(data, tmp_path, model, *extra):
    out = tmp_path / f"{model}.json"
    assert ctr.main(["--train", str(data / "train.csv"), "--test", str(data / "test.csv"), "--schema",
                     str(data / "schema.json"), "--model", model, "--epochs", "6", "--batch-size", "64",
                     "--dim", "8", "--hidden", "32,16", "--lr", "0.01", "--table-lr", "0.5",
                     "--json", str(out), *extra]) == 0
    return json.loads(out.read_text())


def test_din_sees_what_deepfm_cannot_and_its_exports_score_alike(local_server, data, tmp_path):  # noqa: F811
    din = run(data, tmp_path, "din", "--max-len", "8", "--export", str(tmp_path / "din.pt"))
    deepfm = run(data, tmp_path, "deepfm")
    print(f"test AUC: DIN {din['final']['auc']:.4f}, DeepFM {deepfm['final']['auc']:.4f}, oracle {ORACLE_AUC:.4f}")
    assert din["settings"]["max_len"] == 8
    # Measured: DIN 0.88, DeepFM 0.75 (its FM term <v_item, mean of the history's v> sees some of it:
    # the shared id space gives an item in the history its own vector's square norm).
    assert din["final"]["auc"] > ORACLE_AUC - 0.05
    assert din["final"]["auc"] > deepfm["final"]["auc"] + 0.07

    scored = predict_files(tmp_path / "din.pt", [data / "test.csv"], tmp_path / "scores.csv")
    assert scored["rows"] == din["final"]["rows"] == 1500
    assert scored["auc"] == pytest.approx(din["final"]["auc"], abs=1e-6)

    export_portable(tmp_path / "din.pt", tmp_path / "din.ts", "torchscript")
    scripted = torch.jit.load(str(tmp_path / "din.ts"))
    schema = Schema.from_dict(torch.load(tmp_path / "din.pt", weights_only=True)["spec"]["schema"])
    inputs = (b.torch() for b in TabularReader([data / "test.csv"], schema, 500))     # the encoded batches
    ts = np.concatenate([scripted(t["dense"], t["ids"], t["offsets"], t["weights"]).numpy() for t in inputs])
    want = np.loadtxt(tmp_path / "scores.csv", delimiter=",", skiprows=1, usecols=0)        # score,label
    assert ts.shape == want.shape and np.abs(ts - want).max() < 1e-5
