"""A trained CTR model for serving outside Python: TorchScript or ONNX, one self-contained file.

``export_portable(source, out, "torchscript" | "onnx")`` (`paramshard export-model --format`):
``source`` is a checkpoint (as for the paramshard model file) or a model file. The file's
recorded model is built and loaded as ``load_model(FILE)`` does, then every table becomes a
module of tensors (inference/frozen_tables.py: rows, sorted ids, the unseen ids' rows), so
the exported graph needs neither servers, numpy nor paramshard.

The input contract (``inputs(schema)``; docs/serving.md) is what the model's forward takes
after the schema's encoding (data/features/encode.py: the hashing of values to ids stays
outside):

    dense    float32 [B, num_dense]     the schema's dense_names, in order
    ids      int64   [B, num_fields]    one id per field (the schema's fields, in order)
    -- when a field holds bags (a "multi" column), instead:
    ids      int64   [N]                every bag's ids, row by row, field by field
    offsets  int64   [B * num_fields]   where the bag of (row b, field f) starts, at b * F + f
    weights  float32 [N]                one per id (the encoder gives 1/len(bag))

and the output ``score`` float32 [B], sigmoid(logit): what `paramshard predict` writes; a
regression model's predicted value in the label's units, [B]; a multi-task model's
probabilities [B, T], one column per label in the contract's order (models/heads.py).
An id the table does not hold scores as in predict (its initial row, or zeros when the
table's admission would not have given it one; ``unknown="zeros"``: zeros).
"""
from __future__ import annotations

import contextlib
import json
import logging
import tempfile
import warnings
from pathlib import Path

import torch
import torch.nn as nn

from paramshard.errors import ConfigError
from paramshard.export import replaced_into_place
from paramshard.inference.frozen_tables import FrozenHashedTable, FrozenTable
from paramshard.inference.serving import ModelFile, ModelFileError, build_module, export_model, read_model
from paramshard.models.heads import head_of

FORMATS = ("torchscript", "onnx")
ONNX_OPSET = 18          # BitwiseXor/BitwiseAnd (the id hash) are opset 18
ONNX_NEEDS = "pip install 'paramshard[onnx]' (onnx, onnxscript; onnxruntime to score the file)"


class Scores(nn.Module):
    """The model's scores from one id per field: probabilities [B] float32 (a regression's
    values [B], a multi-task model's [B, T]: models/heads.py, as predict scores)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.head = head_of(model)      # constants of the graph (kind, the label's mean and std)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.head.scores(self.model(dense, ids))


class BagScores(Scores):
    """The model's scores from bags of ids (flat ids, offsets, weights)."""

    def forward(self, dense: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor,    # type: ignore[override]
                weights: torch.Tensor) -> torch.Tensor:
        return self.head.scores(self.model(dense, ids, offsets, weights))


def has_bags(schema) -> bool:
    """Whether the encoded batch is flat ids with offsets (a field of several ids per row)."""
    return any(c.kind not in ("categorical", "numeric") for c in schema.fields)


def inputs(schema) -> list[dict]:
    """The exported module's inputs, in order: name, dtype, shape (B rows, N ids in all)."""
    d, f = schema.num_dense, schema.num_fields
    if not has_bags(schema):
        return [{"name": "dense", "dtype": "float32", "shape": ["B", d], "columns": schema.dense_names},
                {"name": "ids", "dtype": "int64", "shape": ["B", f], "fields": [c.name for c in schema.fields]}]
    return [{"name": "dense", "dtype": "float32", "shape": ["B", d], "columns": schema.dense_names},
            {"name": "ids", "dtype": "int64", "shape": ["N"], "fields": [c.name for c in schema.fields]},
            {"name": "offsets", "dtype": "int64", "shape": [f"B*{f}"]},
            {"name": "weights", "dtype": "float32", "shape": ["N"]}]


def contract(model: ModelFile) -> dict:
    """What the exported file documents about itself (TorchScript extra file, ONNX metadata)."""
    from paramshard.specs.schema import Schema
    spec = model.spec
    if spec is None or spec.get("schema") is None:
        raise ModelFileError(f"{model.path}: no recorded model with a schema: --format torchscript|onnx exports "
                             f"a model built by paramshard.models.build_model (the CTR app's), whose schema "
                             f"defines the inputs")
    schema = Schema.from_dict(spec["schema"], where=f"{model.path}: the recorded schema")
    return {"model": spec["model"], "step": model.step, "inputs": inputs(schema),
            "outputs": [score_output(schema)], "schema": spec["schema"]}


def score_output(schema) -> dict:
    """The output's contract: probabilities [B]; a regression's values [B]; [B, T] per label."""
    if schema.label_kind == "multitask":
        return {"name": "score", "dtype": "float32", "shape": ["B", len(schema.tasks)], "labels": schema.label_names,
                "meaning": "the probability of each label, columns in this order"}
    if schema.label_kind == "regression":
        return {"name": "score", "dtype": "float32", "shape": ["B"], "labels": schema.label_names,
                "meaning": "the predicted value, in the label's units"}
    return {"name": "score", "dtype": "float32", "shape": ["B"], "labels": schema.label_names,
            "meaning": "the probability that the label is 1"}


def freeze_tables(module: nn.Module, model: ModelFile, unknown: str) -> nn.Module:
    """Every SparseEmbedding of ``module`` becomes a FrozenTable of the file's rows and every
    HashedEmbeddingBag a FrozenHashedTable: the module then holds everything it reads."""
    from paramshard.models.hashed import HashedEmbeddingBag
    from paramshard.trainer.sparse_embedding import SparseEmbedding

    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, SparseEmbedding):
                setattr(parent, name, FrozenTable(model.tables[child.name], child.mode, unknown))
            elif isinstance(child, HashedEmbeddingBag):
                setattr(parent, name, FrozenHashedTable(child))
    return module


def portable_module(model: ModelFile, unknown: str = "initial") -> tuple[nn.Module, dict]:
    """The file's recorded model as a module of tensors only, in eval mode, and its contract."""
    about = contract(model)          # first: a file without a recorded schema is refused here
    module = freeze_tables(build_module(model, unknown=unknown), model, unknown).eval()
    bags = len(about["inputs"]) == 4
    wrapped = (BagScores if bags else Scores)(module).eval()
    for p in wrapped.parameters():
        p.requires_grad_(False)
    return wrapped, about


def example_inputs(about: dict, rows: int = 3) -> tuple[torch.Tensor, ...]:
    """Inputs of the contract's shapes (for tracing): ``rows`` rows, one id per bag."""
    d = about["inputs"][0]["shape"][1]
    f = len(about["inputs"][1]["fields"])
    dense = torch.zeros(rows, d)
    ids = torch.arange(rows * f, dtype=torch.int64)
    if len(about["inputs"]) == 2:
        return dense, ids.view(rows, f)
    return dense, ids, torch.arange(rows * f, dtype=torch.int64), torch.ones(rows * f)


def read_source(source) -> ModelFile:
    """A model file, or a checkpoint (exported to a temporary model file first: every file checked)."""
    source = Path(source)
    if source.is_file():
        return read_model(source)
    with tempfile.TemporaryDirectory(prefix="paramshard-export-") as tmp:
        export_model(source, Path(tmp) / "model.pt")
        return read_model(Path(tmp) / "model.pt")


def export_portable(source, out, fmt: str, unknown: str = "initial") -> dict:
    """Write ``source``'s model (a checkpoint or model file) to ``out`` as ``fmt``; returns the contract."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: one of paramshard, {', '.join(FORMATS)}")
    if fmt == "onnx":
        onnx_package()
    out = Path(out)
    if not out.parent.is_dir():
        raise ModelFileError(f"--out {out}: directory {out.parent} does not exist")
    model = read_source(source)
    module, about = portable_module(model, unknown)
    with replaced_into_place(out) as tmp:
        (write_torchscript if fmt == "torchscript" else write_onnx)(module, about, tmp)
    return about


def write_torchscript(module: nn.Module, about: dict, path) -> None:
    # The models' input checks compare shapes in Python: the tracer warns they are fixed in
    # the trace. They hold for every input of the contract (the dims they fix are the schema's).
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        # torch 2.13 deprecates TorchScript (for torch.export); it still writes and runs, and
        # C++ serving loads it: the choice of format is the user's (onnx is the other).
        warnings.simplefilter("ignore", DeprecationWarning)
        traced = torch.jit.trace(module, example_inputs(about), check_trace=False)
        torch.jit.save(traced, str(path), _extra_files={"paramshard.json": json.dumps(about)})


def onnx_package():
    """The onnx module, checked before any work: torch.onnx.export needs onnx and onnxscript."""
    try:
        import onnx
        import onnxscript  # noqa: F401  (torch.onnx.export's translation of the graph)
    except ImportError as exc:
        raise ConfigError(f"--format onnx needs the onnx packages ({exc}): {ONNX_NEEDS}") from None
    return onnx


@contextlib.contextmanager
def quiet_exporter():
    """torch.onnx.export's own notes (optional torchvision ops skipped, deprecations inside
    torch, renamed axes) are about torch, not about this model: not shown to the user."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "torch.export", "onnx_ir", "onnxscript")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def write_onnx(module: nn.Module, about: dict, path) -> None:
    onnx = onnx_package()
    names = [i["name"] for i in about["inputs"]]
    batch = torch.export.Dim("B", min=1)
    if len(names) == 2:
        shapes = {"dense": {0: batch}, "ids": {0: batch}}
    else:
        fields = len(about["inputs"][1]["fields"])
        n = torch.export.Dim("N", min=1)
        shapes = {"dense": {0: batch}, "ids": {0: n}, "offsets": {0: fields * batch}, "weights": {0: n}}
    with torch.no_grad(), quiet_exporter():
        program = torch.onnx.export(module, example_inputs(about), dynamo=True, input_names=names,
                                    output_names=["score"], dynamic_shapes=shapes, opset_version=ONNX_OPSET,
                                    optimize=True, verbose=False)
    if program is None:         # only when export is given a file to write, which it is not here
        raise ConfigError("torch.onnx.export returned no program")
    proto = program.model_proto
    onnx.helper.set_model_props(proto, {"paramshard": json.dumps(about)})
    onnx.save(proto, str(path))
