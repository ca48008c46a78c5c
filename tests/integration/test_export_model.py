"""A trained model served without servers: checkpoint -> `paramshard export-model` ->
ps.load_model into a fresh module gives exactly what the trained model gave through the
servers; bad checkpoints, bad files and modules that do not fit are named."""
import shutil

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import paramshard as ps
from paramshard.cli.main import main as cli_main
from paramshard.errors import ConfigError
from paramshard.inference.serving import ModelFileError, read_model
from paramshard.placement.sparse_hash import admitted_by_probability, initial_rows
from paramshard.trainer.trainer import Trainer
from tests.conftest import Cluster

DIM, RARE_DIM, VOCAB, STEPS = 8, 4, 200, 8
SEED, RARE_SEED, SCALE = 3, 7, 0.05


class Model(nn.Module):
    def __init__(self, dim=DIM, hidden=32, rare=True, extra=False):
        super().__init__()
        torch.manual_seed(0)
        self.emb = ps.SparseEmbedding("feat", dim, optimizer=ps.optim.Adagrad(lr=0.1), seed=SEED, init_scale=SCALE)
        # Half the ids never get a row: they read zeros on the servers, and must here too.
        self.rare = ps.SparseEmbedding("rare", RARE_DIM, seed=RARE_SEED, admission=ps.Admission(probability=0.5)) \
            if rare else None
        self.mlp = nn.Sequential(nn.Linear(dim + (RARE_DIM if rare else 0), hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.frozen = nn.Linear(2, 2).requires_grad_(False)    # never on the servers, never in the file
        if extra:
            self.extra = nn.Linear(2, 2)

    def forward(self, ids):
        parts = [self.emb(ids)] + ([self.rare(ids)] if self.rare is not None else [])
        return self.mlp(torch.cat(parts, dim=1)).squeeze(1)


def train_batch(step):
    g = np.random.default_rng(step)
    ids = torch.from_numpy((g.zipf(1.3, (32, 4)) % VOCAB).astype(np.int64))
    return ids, torch.from_numpy((g.random(32) < 0.4).astype(np.float32))


# Ids the training saw and ids it never saw (among them negative int64: uint64 bit patterns).
UNSEEN = torch.tensor([10_000, 123_456_789, -5, -(1 << 62)], dtype=torch.int64)
EVAL_IDS = torch.cat([torch.arange(40).view(10, 4), UNSEEN.view(1, 4), torch.tensor([[1, 10_000, 2, -5]])])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A checkpoint of a model trained through 2 real servers, and what that model
    predicted for EVAL_IDS through them (eval mode: create=False pulls)."""
    root = tmp_path_factory.mktemp("export")
    c = Cluster(servers=2, trainers=1, mode="sync", timeout=20.0)
    try:
        model = Model()
        trainer = Trainer(model, ps.optim.Adam(lr=0.01), env=c.trainer_env(0))
        for k in range(STEPS):
            ids, y = train_batch(k)
            trainer.step(F.binary_cross_entropy_with_logits(model(ids), y))
        trainer.pull()
        model.eval()
        with torch.no_grad():
            expected = model(EVAL_IDS).numpy()
        trainer.save(root / "ckpt")
        trainer.close()
    finally:
        c.close()
    return root / "ckpt", expected


def export(ckpt, out) -> int:
    return cli_main(["export-model", str(ckpt), "--out", str(out)])


def test_loaded_model_predicts_exactly_what_the_servers_gave(trained, tmp_path, capsys):
    ckpt, expected = trained
    assert export(ckpt, tmp_path / "m.pt") == 0
    assert f"wrote {tmp_path / 'm.pt'}: step {STEPS}" in capsys.readouterr().out
    fresh = Model()
    with pytest.raises(ConfigError, match="ps.load_model"):      # no servers, nothing loaded: a clear error
        fresh(EVAL_IDS)
    assert ps.load_model(fresh, tmp_path / "m.pt") is fresh
    fresh.eval()
    with torch.no_grad():
        got = fresh(EVAL_IDS).numpy()
    np.testing.assert_array_equal(got, expected)
    assert not np.array_equal(Model().mlp[0].weight.detach().numpy(), fresh.mlp[0].weight.detach().numpy())


def test_unknown_ids_read_their_initial_row_or_zeros(trained, tmp_path):
    ckpt, _ = trained
    export(ckpt, tmp_path / "m.pt")
    ids = UNSEEN.view(-1, 1)
    as_u64 = UNSEEN.numpy().view(np.uint64)
    initial = Model()
    ps.load_model(initial, tmp_path / "m.pt")
    with torch.no_grad():
        np.testing.assert_array_equal(initial.emb(ids).numpy(), initial_rows(SEED, as_u64, DIM, SCALE))
        rare = initial.rare(ids).numpy()
    admitted = admitted_by_probability(RARE_SEED, as_u64, 0.5)
    assert admitted.any() and not admitted.all()          # both cases are tested
    np.testing.assert_array_equal(rare[admitted], initial_rows(RARE_SEED, as_u64[admitted], RARE_DIM, 0.01))
    assert not rare[~admitted].any()
    zeros = Model()
    ps.load_model(zeros, tmp_path / "m.pt", unknown="zeros")
    with torch.no_grad():
        assert not zeros.emb(ids).numpy().any() and not zeros.rare(ids).numpy().any()
        seen = torch.tensor([[1], [2]])
        np.testing.assert_array_equal(zeros.emb(seen).numpy(), initial.emb(seen).numpy())
    with pytest.raises(ConfigError, match="unknown='random'"):
        ps.load_model(Model(), tmp_path / "m.pt", unknown="random")


def test_training_mode_forward_works_and_rows_stay_constants(trained, tmp_path):
    ckpt, expected = trained
    export(ckpt, tmp_path / "m.pt")
    model = ps.load_model(Model(), tmp_path / "m.pt")
    model.train()
    model(EVAL_IDS).sum().backward()
    assert model.mlp[0].weight.grad is not None          # dense parameters are plain torch parameters
    assert model.emb._touched == [] and model.emb.take_gradients()[0].size == 0   # nothing kept for rows
    model.eval()
    with torch.no_grad():
        np.testing.assert_array_equal(model(EVAL_IDS).numpy(), expected)


def test_the_file_holds_only_plain_data_with_its_settings(trained, tmp_path):
    ckpt, _ = trained
    export(ckpt, tmp_path / "m.pt")
    data = torch.load(tmp_path / "m.pt", weights_only=True)
    assert data["format"] == "paramshard-model" and data["version"] == 1 and data["step"] == STEPS
    assert set(data["dense"]) == {"mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias"}
    assert data["dense"]["mlp.0.weight"].shape == (32, DIM + RARE_DIM)
    feat = data["sparse"]["feat"]
    assert (feat["dim"], feat["seed"], feat["init_scale"]) == (DIM, SEED, SCALE)
    assert data["sparse"]["rare"]["admission"] == {"min_count": 1, "probability": 0.5}
    assert feat["rows"].shape == (len(feat["ids"]), DIM) and 0 < len(feat["ids"]) <= VOCAB
    # The module's state_dict names: loadable by name into the plain torch part of the model.
    Model().mlp.load_state_dict({k[len("mlp."):]: v for k, v in data["dense"].items()})


# ---------------------------------------------------------------- the command's errors

def test_a_missing_checkpoint_is_named(tmp_path, capsys):
    assert export(tmp_path / "nope", tmp_path / "m.pt") == 2
    err = capsys.readouterr().err
    assert err.startswith("paramshard export-model: error: ") and f"{tmp_path / 'nope'} does not exist" in err
    assert not (tmp_path / "m.pt").exists()


@pytest.mark.parametrize("relpath", ["sparse/t0/values.npy", "dense/p0.slot0.npy"])
def test_a_corrupted_file_is_named_and_the_old_output_stays(trained, tmp_path, capsys, relpath):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(trained[0], ckpt)
    step = next(ckpt.glob("step-*"))
    data = bytearray((step / relpath).read_bytes())
    data[-1] ^= 0xFF
    (step / relpath).write_bytes(bytes(data))
    out = tmp_path / "out"
    out.mkdir()
    (out / "m.pt").write_bytes(b"the previous export")
    assert export(ckpt, out / "m.pt") == 2
    err = capsys.readouterr().err
    assert "paramshard export-model: error:" in err and f"{relpath}: CRC-32" in err and "corrupted" in err
    assert (out / "m.pt").read_bytes() == b"the previous export"
    assert [p.name for p in out.iterdir()] == ["m.pt"]


def test_out_is_replaced_atomically(trained, tmp_path, monkeypatch, capsys):
    out = tmp_path / "m.pt"
    out.write_bytes(b"the previous export")

    def dies_half_way(obj, path):
        with open(path, "wb") as f:
            f.write(b"half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", dies_half_way)
    assert export(trained[0], out) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert out.read_bytes() == b"the previous export" and [p.name for p in tmp_path.iterdir()] == ["m.pt"]
    monkeypatch.undo()
    assert export(trained[0], out) == 0
    assert read_model(out).step == STEPS and [p.name for p in tmp_path.iterdir()] == ["m.pt"]
    assert export(trained[0], tmp_path / "no" / "m.pt") == 2
    assert f"directory {tmp_path / 'no'} does not exist" in capsys.readouterr().err


# ---------------------------------------------------------------- modules and files that do not fit

@pytest.fixture
def model_file(trained, tmp_path):
    export(trained[0], tmp_path / "m.pt")
    return tmp_path / "m.pt"


@pytest.mark.parametrize("module,message", [
    (lambda: Model(hidden=16), r"parameter mlp.0.weight is \[16, 12\] here, \[32, 12\] in m.pt"),
    (lambda: Model(extra=True), r"parameter extra.weight is not in m.pt"),
    (lambda: Model(dim=16), r"sparse table 'feat' is dim 16 here, dim 8 in m.pt"),
    (lambda: Model(rare=False), r"m.pt's sparse table 'rare' is not in this model"),
])
def test_a_module_that_does_not_fit_is_named_and_left_unchanged(model_file, module, message):
    m = module()
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    with pytest.raises(ModelFileError, match=rf"{model_file} does not fit this model: .*{message}"):
        ps.load_model(m, model_file)
    for n, p in m.named_parameters():
        assert torch.equal(p, before[n]), n
    with pytest.raises(ConfigError, match="ps.load_model"):
        m.emb(torch.tensor([[1]]))


def test_a_parameter_the_module_lacks_is_named(model_file):
    class Shallow(Model):
        def __init__(self):
            super().__init__()
            self.mlp = nn.Sequential(nn.Linear(DIM + RARE_DIM, 32))

    with pytest.raises(ModelFileError, match=r"m.pt's parameter mlp.2.weight is not in this model"):
        ps.load_model(Shallow(), model_file)


def test_files_that_are_not_an_export_are_named(model_file, tmp_path):
    def refused(path, match):
        with pytest.raises(ModelFileError, match=match):
            ps.load_model(Model(), path)

    refused(tmp_path / "missing.pt", "missing.pt: no such file; make one with `paramshard export-model")
    (tmp_path / "text.pt").write_text("hello")
    refused(tmp_path / "text.pt", "text.pt: not a paramshard model file")
    torch.save(Model().state_dict(), tmp_path / "state.pt")
    refused(tmp_path / "state.pt", "state.pt: not a paramshard model file .no format tag")
    torch.save(nn.Linear(2, 2), tmp_path / "pickled.pt")          # would run pickled code: refused
    refused(tmp_path / "pickled.pt", "pickled.pt: not a paramshard model file")
    data = torch.load(model_file, weights_only=True)
    torch.save({**data, "version": 99}, tmp_path / "future.pt")
    refused(tmp_path / "future.pt", "model file version 99, this paramshard reads version 1")
    data["sparse"]["feat"]["rows"] = data["sparse"]["feat"]["rows"][:, :3]
    torch.save(data, tmp_path / "damaged.pt")
    refused(tmp_path / "damaged.pt", r"damaged.pt: damaged model file .*table 'feat'")


def test_a_module_of_its_own_records_no_model_so_load_model_needs_it(model_file):
    """Model declares no paramshard_spec: the file has none, and loading it alone says to pass
    the module (built-in models record theirs: tests/integration/test_serving_snapshot.py)."""
    assert "spec" not in torch.load(model_file, weights_only=True) and read_model(model_file).spec is None
    with pytest.raises(ModelFileError, match=r"m.pt: this model file has no recorded model .*"
                                             r"pass the module, ps.load_model\(module, FILE\)"):
        ps.load_model(model_file)
    with pytest.raises(ConfigError, match=r"pass the model file too, load_model\(module, FILE\)"):
        ps.load_model(Model())


def test_a_declared_spec_travels_through_the_checkpoint_into_the_file(tmp_path):
    """A module of the user's own that declares paramshard_spec: the chief writes it into the
    manifest, export-model copies it, and ps.load_model(FILE, classes=...) builds and loads it."""
    class Declared(Model):
        def __init__(self, hidden=32):
            super().__init__(hidden=hidden)
            self.paramshard_spec = {"model": "declared", "args": {"hidden": hidden}}

    c = Cluster(servers=1, trainers=1, mode="sync", timeout=20.0)
    try:
        model = Declared(hidden=16)
        trainer = Trainer(model, ps.optim.Adam(lr=0.01), env=c.trainer_env(0))
        ids, y = train_batch(0)
        trainer.step(F.binary_cross_entropy_with_logits(model(ids), y))
        trainer.pull()
        model.eval()
        with torch.no_grad():
            expected = model(EVAL_IDS).numpy()
        trainer.save(tmp_path / "ckpt")
        trainer.close()
    finally:
        c.close()
    assert export(tmp_path / "ckpt", tmp_path / "m.pt") == 0
    assert read_model(tmp_path / "m.pt").spec == {"model": "declared", "args": {"hidden": 16}}
    loaded = ps.load_model(tmp_path / "m.pt", classes={"declared": Declared})
    assert isinstance(loaded, Declared) and loaded.mlp[0].out_features == 16
    loaded.eval()
    with torch.no_grad():
        np.testing.assert_array_equal(loaded(EVAL_IDS).numpy(), expected)
