"""DCNv2, XDeepFM and AutoInt trained by the CTR app against their plain-PyTorch twins
(tests/unit/models/twins.py: independent code, the model's initial weights copied in) trained
the same way by benchmarks/plain_torch_ctr.py (local EmbeddingBag tables starting as the
servers' rows, torch's Adam and Adagrad at the app's rates, the same rows in the same steps):
in one process (the app's standalone server, SparseEmbedding tables) the test AUCs agree within
0.002, as issue 23 asked of the first models. The app's --export file, scored by `paramshard
predict` (predict_files) without any server, gives the app's own final test metrics."""
import json

import pytest
import torch

from paramshard.apps import ctr
from paramshard.inference.scoring import predict_files
from paramshard.models import build_model
from paramshard.models.defaults import ARCHITECTURE

from tests.unit.benchmark_scripts import import_script
from tests.unit.models.twins import twin_of
from tests.integration.test_models_training import local_server  # noqa: F401  (the fixture)
from tests.integration.test_benchmark_plain_torch_ctr import data  # noqa: F401  (the fixture)

plain = import_script("plain_torch_ctr")


@pytest.mark.parametrize("model", ["dcnv2", "xdeepfm", "autoint"])
def test_the_app_and_the_plain_twin_train_alike_and_the_export_predicts_the_same(
        local_server, data, model, tmp_path, monkeypatch):  # noqa: F811
    common = ["--train", str(data / "train.csv"), "--test", str(data / "test.csv"), "--schema",
              str(data / "fitted.json"), "--model", model, "--epochs", "2", "--batch-size", "64",
              "--dim", "4", "--hidden", "16,8"]
    # Every row trained, no selection: the last epoch is the model in both.
    assert ctr.main(common + ["--valid-fraction", "0", "--json", str(tmp_path / "app.json"),
                              "--export", str(tmp_path / "model.pt")]) == 0
    app = json.loads((tmp_path / "app.json").read_text())
    architecture = {k: v for k, v in app["settings"].items() if k in ARCHITECTURE}
    assert architecture["dim"] == 4 and architecture["hidden"] == [16, 8]

    def build(args, schema, vocab):
        torch.manual_seed(args.seed)      # as the app does: the same initial weights, copied into the twin
        return twin_of(build_model(model, schema, embedding=plain.local_tables(vocab), **architecture))

    monkeypatch.setattr(plain, "build", build)
    args = plain.parser().parse_args(common + ["--json", str(tmp_path / "twin.json")])
    args.lr, args.table_lr = app["settings"]["lr"], app["settings"]["table_lr"]
    got = plain.run(args)
    assert type(got) is dict and got["model"] == model
    print(f"{model}: test AUC app {app['final']['auc']:.6f}, twin {got['final']['auc']:.6f}; train losses "
          f"app {[e['train_loss'] for e in app['epochs']]}, twin {[e['train_loss'] for e in got['epochs']]}")
    for a, b in zip(app["epochs"], got["epochs"], strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-5)
    assert got["final"]["auc"] == pytest.approx(app["final"]["auc"], abs=0.002)
    assert app["final"]["auc"] > 0.6          # both learned something, not two equal coin flips

    scored = predict_files(tmp_path / "model.pt", [data / "test.csv"], tmp_path / "scores.csv")
    assert scored["rows"] == app["final"]["rows"]
    assert scored["auc"] == pytest.approx(app["final"]["auc"], abs=1e-6)
    assert scored["logloss"] == pytest.approx(app["final"]["logloss"], rel=1e-5)
