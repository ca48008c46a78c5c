"""`paramshard export-model --format torchscript|onnx`: every paramshard model, exported with
its tables inside, scores a batch exactly as the PyTorch model loaded from the same file
(ps.load_model, what `paramshard predict` runs) within 1e-5, unseen ids included; from a
checkpoint, the exported file scores a test file as the trained model did through its server."""
import inspect
import json
import sys
import types

import numpy as np
import pytest
import torch

import paramshard as ps
from paramshard.cli.main import main as cli_main
from paramshard.data import TabularReader
from paramshard.errors import ConfigError
from paramshard.inference.portable import export_portable
from paramshard.inference.serving import ModelFileError, model_dict, sparse_entry, write_model_file
from paramshard.models import MODELS, build_model, hashed_embedding
from paramshard.specs.schema import Column, Label, Schema
from paramshard.trainer.sparse_embedding import tables_of
from tests.integration.tiny_ctr import SCORE_BATCH, Job

# Loading the TorchScript file is what a user does; torch 2.13 says TorchScript is deprecated.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
TOLERANCE = 1e-5
FIELDS = [Column("x"), Column("z"), Column("c", "categorical"), Column("d", "categorical")]
SCHEMAS = {"fields": Schema(Label("y"), FIELDS),                                # ids [B, F]
           "bags": Schema(Label("y"), FIELDS + [Column("t", "multi")])}         # flat ids, offsets, weights
# DIN's: the bag "t" a behaviour sequence of "c" (the bags layout's inputs; DIN has no other).
SEQUENCE = Schema(Label("y"), FIELDS + [Column("t", "multi", sequence_of="c")])
CASES = [(name, layout) for name in sorted(MODELS) for layout in sorted(SCHEMAS) if (name, layout) != ("din", "fields")]
# Each table a different policy: an unseen id reads its initial row, a half-stored one, or zeros.
POLICIES = [(types.SimpleNamespace(min_count=1, probability=1.0), "float32"),
            (types.SimpleNamespace(min_count=1, probability=0.5), "float16"),
            (types.SimpleNamespace(min_count=2, probability=1.0), "float32")]
STORED = np.arange(0, 400, 2, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)   # spread, many negative as int64
ROWS = 11          # not the trace's 3 rows: the exported batch size is free


def model_file(path, name, layout, embedding=None):
    """A model file as export-model writes one, of ``name`` built on the layout's schema: random
    dense parameters (the module's initial ones) and tables of random rows for STORED."""
    torch.manual_seed(len(name))
    takes = inspect.signature(MODELS[name]).parameters         # small sizes, for the ones a model takes
    small = {"dim": 4, "hidden": (8,), "cin_layers": (4, 2), "max_len": 2}    # xDeepFM's 2 x 128 maps saturate
    kw = {k: v for k, v in small.items() if k in takes}                        # every score
    schema = SEQUENCE if name == "din" else SCHEMAS[layout]
    module = build_model(name, schema, embedding=embedding, **kw) if embedding else build_model(name, schema, **kw)
    dense = {n: p.detach().numpy() + 0.1 for n, p in module.named_parameters()}
    rng = np.random.default_rng(0)
    sparse = {}
    for k, (table, t) in enumerate(tables_of(module).items()):
        admission, dtype = POLICIES[k % len(POLICIES)]
        sparse[table] = sparse_entry(STORED, rng.normal(0, 0.5, (len(STORED), t.dim)).astype(np.float32), t.dim,
                                     k + 3, 0.3, dtype, admission)
    write_model_file(model_dict(5, None, dense, sparse, module.paramshard_spec), path)
    return path


def batch(layout, seed=1):
    """ROWS rows, half of the ids stored, half never seen (random uint64 bit patterns)."""
    rng = np.random.default_rng(seed)
    schema = SCHEMAS[layout]
    dense = torch.from_numpy(rng.normal(size=(ROWS, schema.num_dense)).astype(np.float32))
    lengths = np.ones(ROWS * schema.num_fields, np.int64)
    if layout == "bags":
        lengths = rng.integers(0, 4, len(lengths))          # empty bags too
        lengths[::schema.num_fields] = 1
    n = int(lengths.sum())
    ids = np.where(rng.random(n) < 0.5, rng.choice(STORED, n), rng.integers(0, 2 ** 64, n, dtype=np.uint64))
    ids = torch.from_numpy(ids.view(np.int64))
    assert not np.isin(ids.numpy().view(np.uint64), STORED).all()      # unseen ids are in the batch
    if layout == "fields":
        return dense, ids.view(ROWS, schema.num_fields)
    offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]))
    weights = torch.from_numpy(np.repeat(1.0 / np.maximum(lengths, 1), lengths).astype(np.float32))
    return dense, ids, offsets, weights


def pytorch_scores(path, inputs, unknown="initial"):
    model = ps.load_model(path, unknown=unknown).eval()
    with torch.no_grad():
        return torch.sigmoid(model(*inputs)).numpy()


def assert_same_scores(got, expected):
    assert got.shape == expected.shape == (ROWS,) and got.dtype == np.float32
    assert np.abs(got - expected).max() <= TOLERANCE
    assert len(np.unique(expected)) == ROWS          # the rows score differently: the batch tells them apart


@pytest.mark.parametrize("name, layout", CASES)
def test_torchscript_scores_equal_the_pytorch_models(tmp_path, name, layout):
    path = model_file(tmp_path / "m.pt", name, layout)
    about = export_portable(path, tmp_path / "m.ts", "torchscript")
    inputs = batch(layout)
    files = {"paramshard.json": ""}
    scripted = torch.jit.load(str(tmp_path / "m.ts"), _extra_files=files)
    assert_same_scores(scripted(*inputs).numpy(), pytorch_scores(path, inputs))
    assert json.loads(files["paramshard.json"]) == about
    assert [i["name"] for i in about["inputs"]] == (["dense", "ids"] if layout == "fields" else
                                                    ["dense", "ids", "offsets", "weights"])


def test_unknown_zeros_and_hashed_tables_are_exported_too(tmp_path):
    path = model_file(tmp_path / "m.pt", "deepfm", "bags")
    inputs = batch("bags", seed=2)
    export_portable(path, tmp_path / "z.ts", "torchscript", unknown="zeros")
    zeros = pytorch_scores(path, inputs, unknown="zeros")
    assert_same_scores(torch.jit.load(str(tmp_path / "z.ts"))(*inputs).numpy(), zeros)
    assert np.abs(zeros - pytorch_scores(path, inputs)).max() > 1e-4      # the choice shows in the scores
    hashed = model_file(tmp_path / "h.pt", "dcn", "fields", embedding=hashed_embedding(64))
    export_portable(hashed, tmp_path / "h.ts", "torchscript")
    inputs = batch("fields", seed=3)
    assert_same_scores(torch.jit.load(str(tmp_path / "h.ts"))(*inputs).numpy(), pytorch_scores(hashed, inputs))


# Every model once, each layout by half of them (an ONNX export takes 5-10 s here): `make test`
# exports the first model (no embeddings' interactions) and DeepFM (bags, the README's model);
# the rest under `pytest -m matrix`, run before a stop.
ONNX_IN_MAKE_TEST = {"lr", "deepfm"}
ONNX_CASES = [pytest.param(name, sorted(SCHEMAS)[k % 2], marks=() if name in ONNX_IN_MAKE_TEST else pytest.mark.matrix)
              for k, name in enumerate(sorted(set(MODELS) - {"din"}))] + [
    pytest.param("din", "bags", marks=pytest.mark.matrix)]


@pytest.mark.parametrize("name, layout", ONNX_CASES)
def test_onnx_scores_equal_the_pytorch_models(tmp_path, name, layout):
    ort = pytest.importorskip("onnxruntime", reason="--format onnx is scored with onnxruntime: "
                                                    "pip install 'paramshard[onnx]'")
    pytest.importorskip("onnxscript", reason="torch.onnx.export needs onnxscript: pip install 'paramshard[onnx]'")
    path = model_file(tmp_path / "m.pt", name, layout)
    about = export_portable(path, tmp_path / "m.onnx", "onnx")
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == [i["name"] for i in about["inputs"]]
    inputs = batch(layout)
    got = session.run(["score"], {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs)})[0]
    assert_same_scores(got, pytorch_scores(path, inputs))
    import onnx
    props = {p.key: p.value for p in onnx.load(str(tmp_path / "m.onnx")).metadata_props}
    assert json.loads(props["paramshard"]) == about


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    return Job(tmp_path_factory.mktemp("portable"))


def test_a_checkpoint_exported_to_torchscript_scores_as_the_trained_model(job, tmp_path, capsys):
    out = tmp_path / "model.ts"
    assert cli_main(["export-model", str(job.ckpt), "--format", "torchscript", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"wrote {out} (torchscript): model deepfm" in said and "offsets int64 [B*3]" in said
    scripted = torch.jit.load(str(out))
    scores = []
    for b in TabularReader([job.root / "test.csv"], job.schema, SCORE_BATCH):      # the encoded inputs
        t = b.torch()
        scores.append(scripted(t["dense"], t["ids"], t["offsets"], t["weights"]).numpy())
    assert np.abs(np.concatenate(scores) - job.expected).max() <= TOLERANCE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.ts"]          # no temporary file left


def test_what_cannot_be_exported_is_named(tmp_path, monkeypatch):
    path = model_file(tmp_path / "m.pt", "lr", "fields")
    data = torch.load(path, weights_only=True)
    del data["spec"]                      # a module of your own: no schema says what its inputs are
    torch.save(data, tmp_path / "own.pt")
    with pytest.raises(ModelFileError, match="own.pt: no recorded model with a schema"):
        export_portable(tmp_path / "own.pt", tmp_path / "x.ts", "torchscript")
    with pytest.raises(ModelFileError, match="directory .*nowhere does not exist"):
        export_portable(path, tmp_path / "nowhere" / "x.ts", "torchscript")
    monkeypatch.setitem(sys.modules, "onnx", None)          # as without the package
    with pytest.raises(ConfigError, match=r"--format onnx needs the onnx packages .*paramshard\[onnx\]"):
        export_portable(path, tmp_path / "x.onnx", "onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt", "own.pt"]


# Labels beyond binary (issue 32; models/heads.py): a regression's value in the label's units [B], a
# multi-task model's probabilities [B, T]. Scored by the model loaded from the file, as predict does.
LABEL_SCHEMAS = {
    "regression": Schema(Label("y", stats={"mean": 20.0, "std": 3.0, "count": 9}), FIELDS, label_kind="regression"),
    "multitask": Schema(Label("y"), FIELDS, label_kind="multitask", labels=[Label("y"), Label("buy")])}


def label_model_file(path, kind):
    SCHEMAS[kind] = LABEL_SCHEMAS[kind]          # model_file builds on SCHEMAS[layout]
    try:
        return model_file(path, "deepfm", kind)
    finally:
        del SCHEMAS[kind]


def head_scores(path, inputs):
    from paramshard.models.heads import head_of
    model = ps.load_model(path).eval()
    with torch.no_grad():
        return head_of(model).scores(model(*inputs)).numpy()


@pytest.mark.parametrize("kind", sorted(LABEL_SCHEMAS))
def test_regression_and_multitask_models_export_their_scores(tmp_path, kind, capsys):
    path = label_model_file(tmp_path / "m.pt", kind)
    assert cli_main(["export-model", str(path), "--format", "torchscript", "--out", str(tmp_path / "m.ts")]) == 0
    said = capsys.readouterr().out
    inputs = batch("fields")
    expected = head_scores(path, inputs)
    got = torch.jit.load(str(tmp_path / "m.ts"))(*inputs).numpy()
    if kind == "regression":
        assert "output score float32 [B] (the predicted value, in the label's units)" in said
        assert got.shape == expected.shape == (ROWS,) and np.abs(got - expected).max() <= 20 * TOLERANCE
        assert expected.min() < 0 or expected.max() > 1                    # a value, no sigmoid
    else:
        assert "output score float32 [B, 2] (the probability of each label, columns in this order: y, buy)" in said
        assert got.shape == expected.shape == (ROWS, 2) and np.abs(got - expected).max() <= TOLERANCE
        assert np.abs(expected[:, 0] - expected[:, 1]).max() > 1e-3        # two heads, not one copied


def test_a_multitask_model_exports_to_onnx_with_one_column_per_label(tmp_path):
    ort = pytest.importorskip("onnxruntime", reason="--format onnx is scored with onnxruntime: "
                                                    "pip install 'paramshard[onnx]'")
    pytest.importorskip("onnxscript", reason="torch.onnx.export needs onnxscript: pip install 'paramshard[onnx]'")
    path = label_model_file(tmp_path / "m.pt", "multitask")
    export_portable(path, tmp_path / "m.onnx", "onnx")
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    inputs = batch("fields")
    got = session.run(["score"], {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs)})[0]
    expected = head_scores(path, inputs)
    assert got.shape == (ROWS, 2) and np.abs(got - expected).max() <= TOLERANCE
