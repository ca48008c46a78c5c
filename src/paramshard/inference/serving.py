"""A trained model as one file, served without parameter servers.

``export_model(checkpoint, out)`` (the `paramshard export-model` command) turns a
checkpoint into one ``torch.save``d dict:

    {"format": "paramshard-model", "version": 1, "step": 1200, "checkpoint": "runs/ckpt/step-00001200",
     "dense":  {"mlp.0.weight": tensor [400, 429], ...},          # parameter name -> float32 tensor
     "sparse": {"deep": {"ids": int64 tensor [n] (uint64 bit patterns), "rows": float32 tensor [n, dim],
                         "dim": 16, "seed": 0, "init_scale": 0.01, "dtype": "float32",
                         "admission": {"min_count": 1, "probability": 1.0}}, ...}}

``spec`` (only in a file whose model recorded one, paramshard/specs/model_spec.py): what
built the model (its name, architecture arguments and fitted schema), so
``build_from_file(file)`` (or ``load_model(file)``) builds the module itself and
`paramshard predict` encodes data with no code. A file without it loads into a
module the caller builds.

``dtype``: how the servers stored the table's rows (the rows here are those values as
float32, exactly); an id without a row reads its initial row rounded the same way. A
file without it (written before half rows existed) means float32.

Only tensors, ints, floats, strings, lists and dicts: ``torch.load(weights_only=True)``
reads it without running any pickled code, and only once its sizes were checked
(checkpoint/model_archive.py: no tensor larger than the data the file holds, no compression
bomb); a recorded spec is built on the meta device first and must fit the file's
tensors before anything is allocated for it. ``load_model(module, file)`` copies the
dense parameters into the module and gives every SparseEmbedding a local table;
``load_model(file)`` builds the module from the file's spec first.
``snapshot_model(trainer, file)`` writes the same file from a live job.
An id the table does not hold reads what the servers would have given it in
evaluation (``unknown="initial"``: its deterministic initial row, or zeros when the
table's admission policy would not have given it a row) or zeros (``unknown="zeros"``).
Rows are constants: backward reaches the dense parameters only.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from paramshard.checkpoint.format import Checkpoint, CheckpointError
from paramshard.errors import ConfigError
from paramshard.export import replaced_into_place
from paramshard.checkpoint.model_archive import ModelArchiveError, NotAnArchive, check_model_archive
from paramshard.specs.model_spec import SpecError, check_spec, spec_of
from paramshard.placement.sparse_hash import admitted_by_probability, initial_rows
from paramshard.server.storage.row_formats import rounded
from paramshard.tables import ROW_DTYPES, policy_from_wire

FORMAT = "paramshard-model"
FORMAT_VERSION = 1
UNKNOWN = ("initial", "zeros")
MAKE_ONE = "make one with `paramshard export-model CHECKPOINT --out FILE`"


class ModelFileError(ConfigError):
    """A model file that is missing, not an export, or does not fit the module."""


# ---------------------------------------------------------------- checkpoint -> file

def export_model(checkpoint, out) -> dict:
    """Write the model of ``checkpoint`` (a checkpoint directory or step directory) to
    ``out``, after verifying every file of the checkpoint. Returns the written dict."""
    ckpt = Checkpoint(checkpoint)
    needed = {d["files"]["values"] for d in ckpt.manifest["dense"]}
    needed |= {t["files"][part] for t in ckpt.manifest["sparse"] for part in ("ids", "values")}
    # Every file, not only the ones exported: a damaged checkpoint is named now, not at resume.
    arrays = {}
    for relpath in ckpt.manifest["files"]:
        array = ckpt.array(relpath)
        if relpath in needed:
            arrays[relpath] = array
    missing = sorted(needed - set(arrays))
    if missing:
        raise CheckpointError(f"{ckpt.path}: the manifest lists no file {missing[0]} (incomplete checkpoint)")
    dense = {entry["name"]: arrays[entry["files"]["values"]].reshape(entry["shape"])
             for entry in ckpt.manifest["dense"]}
    sparse = {}
    for entry in ckpt.manifest["sparse"]:
        admission, _, init_scale = policy_from_wire(entry["policy"])
        sparse[entry["name"]] = sparse_entry(arrays[entry["files"]["ids"]], arrays[entry["files"]["values"]],
                                             entry["dim"], entry["seed"], init_scale,
                                             entry.get("dtype", "float32"), admission)
    model = model_dict(ckpt.step, str(ckpt.path), dense, sparse, ckpt.manifest.get("model"))
    write_model_file(model, out)
    return model


def model_dict(step: int, source: str | None, dense: dict, sparse: dict, spec: dict | None) -> dict:
    """The file's dict: ``dense`` name -> float32 array of the parameter's shape; ``sparse``
    name -> sparse_entry(...); ``source``: the checkpoint it came from (None: a live job)."""
    model = {"format": FORMAT, "version": FORMAT_VERSION, "step": int(step), "checkpoint": source,
             "dense": {name: torch.from_numpy(np.ascontiguousarray(values, np.float32))
                       for name, values in dense.items()},
             "sparse": sparse}
    if spec is not None:            # a file without it stays what version 1 always was
        model["spec"] = spec
    return model


def sparse_entry(ids: np.ndarray, rows: np.ndarray, dim: int, seed: int, init_scale: float, dtype: str,
                 admission) -> dict:
    """One table of the file: ``ids`` (uint64) and their ``rows`` as float32, sorted by id once
    here (lookups search them as they are), and the settings an unknown id's row needs."""
    ids = ids.astype(np.uint64, copy=False)
    rows = rows.astype(np.float32, copy=False)
    order = np.argsort(ids, kind="stable")
    return {"ids": torch.from_numpy(ids[order].view(np.int64)), "rows": torch.from_numpy(rows[order]),
            "dim": int(dim), "seed": int(seed), "init_scale": float(init_scale), "dtype": str(dtype),
            "admission": {"min_count": admission.min_count, "probability": admission.probability}}


def write_model_file(model: dict, out) -> None:
    """``model`` into ``out``, replaced atomically (a reader never sees half a file)."""
    out = Path(out)
    if not out.parent.is_dir():
        raise ModelFileError(f"--out {out}: directory {out.parent} does not exist")
    try:
        with replaced_into_place(out) as tmp:
            torch.save(model, tmp)
    except OSError as exc:
        raise ModelFileError(f"--out {out}: cannot write ({exc.strerror or exc})") from None


# ---------------------------------------------------------------- live job -> file

def snapshot_model(trainer, out) -> dict:
    """Write the model ``trainer`` trains, at its current step, to ``out``: the file
    export_model writes of a checkpoint saved at this step (the app's "best epoch so far").
    Dense: the values this trainer holds (``trainer.pull()`` first); collective and hybrid
    modes' hashed tables are among them. Tables: every SparseEmbedding's ids and rows read
    from the servers as a checkpoint reads them, in sync mode once every table completed
    this step (the optimizer's state stays there). Only the calling trainer takes part."""
    from paramshard.client.checkpoint import gather_table     # the network side: imported only for a live job

    trainer.backend.flush()        # this trainer's pushes are on the servers
    follow = getattr(trainer.backend, "follow_routing", None)
    if follow is not None:         # elastic servers: one a scale removed (and stopped) is not asked
        follow()
    step = trainer.step_count
    # Copies: the trainer's values are its parameters' memory, and training goes on.
    dense = trainer.dense_values()
    sparse = {}
    min_version = trainer.backend.row_version(step)     # what a pull at this step waits for
    for name, table in trainer.tables.items():
        parts, _, _, _ = gather_table(trainer.links, name, min_version, only=("ids", "values"))
        spec = table.spec
        sparse[name] = sparse_entry(parts["ids"], parts["values"], spec.dim, spec.seed, spec.init_scale,
                                    spec.dtype, spec.admission)
    model = model_dict(step, None, dense, sparse, spec_of(trainer.model))
    write_model_file(model, out)
    return model


# ---------------------------------------------------------------- file -> module

@dataclasses.dataclass
class LocalTable:
    """A table's rows in this process: ids sorted (uint64), rows [n, dim]."""
    name: str
    ids: np.ndarray
    rows: np.ndarray
    seed: int
    init_scale: float
    min_count: int = 1
    probability: float = 1.0
    dtype: str = "float32"          # how the servers stored the rows (server/storage/row_formats.py)

    @property
    def dim(self) -> int:
        return self.rows.shape[1]

    def lookup(self, ids: np.ndarray, unknown: str = "initial") -> np.ndarray:
        """Rows of uint64 ``ids`` [n] -> float32 [n, dim]. An id without a row reads as it
        would from the servers in evaluation (paramshard.server.storage.sparse_table.pull with
        create=False) with ``unknown="initial"``, or zeros."""
        ids = np.asarray(ids, np.uint64)
        out = np.zeros((len(ids), self.dim), np.float32)
        if len(self.ids):
            pos = np.minimum(np.searchsorted(self.ids, ids), len(self.ids) - 1)
            found = self.ids[pos] == ids
            out[found] = self.rows[pos[found]]
        else:
            found = np.zeros(len(ids), bool)
        if unknown == "initial":
            fill_unknown(out, ids, found, self)
        return out

    def row_source(self, unknown: str):
        """A SparseEmbedding.attach row source (ids, training) -> rows."""
        return lambda ids, training: self.lookup(ids, unknown)


def fill_unknown(out: np.ndarray, ids: np.ndarray, found: np.ndarray, table) -> None:
    """Rows of ids not ``found`` in ``out`` as the servers give them in evaluation: the
    deterministic initial row (rounded to the table's row format) of an id its admission policy
    would have given a row, zeros (left as they are) otherwise. ``table``: seed, dim, init_scale,
    min_count, probability, dtype (a LocalTable; serving's live tables share it)."""
    if table.min_count != 1 or found.all():
        return
    absent = np.flatnonzero(~found)
    fresh = absent[admitted_by_probability(table.seed, ids[absent], table.probability)]
    out[fresh] = rounded(initial_rows(table.seed, ids[fresh], table.dim, table.init_scale), table.dtype)


@dataclasses.dataclass
class ModelFile:
    path: Path
    step: int
    dense: dict[str, torch.Tensor]
    tables: dict[str, LocalTable]
    spec: dict | None = None          # what built the model (specs/model_spec.py), when the file records it


def read_model(path) -> ModelFile:
    """An exported model file, checked to be one (no pickled code runs while reading it)."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path}: {'not a file' if path.exists() else 'no such file'}; {MAKE_ONE}")
    try:
        check_model_archive(path)       # before torch.load believes a single size in it
    except NotAnArchive as exc:
        raise ModelFileError(f"{path}: not a paramshard model file ({exc}); {MAKE_ONE}") from None
    except ModelArchiveError as exc:
        raise ModelFileError(f"{path}: refused before reading it: {exc}. Nothing was allocated for it; if it "
                             f"should be a model file, {MAKE_ONE} again from the checkpoint (a file that was "
                             f"sent or edited is not trusted)") from None
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:     # zip, pickle and torch errors alike: the file is not ours
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise ModelFileError(f"{path}: not a paramshard model file ({reason}); {MAKE_ONE}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ModelFileError(f"{path}: not a paramshard model file (no format tag {FORMAT!r}); {MAKE_ONE}")
    if data.get("version") != FORMAT_VERSION:
        raise ModelFileError(f"{path}: model file version {data.get('version')!r}, this paramshard reads "
                             f"version {FORMAT_VERSION}; export it again with this paramshard")
    try:
        dense = {str(name): _tensor(t, torch.float32) for name, t in data["dense"].items()}
        tables = {str(name): _table(str(name), t) for name, t in data["sparse"].items()}
        step = int(data["step"])
        spec = check_spec(data["spec"]) if data.get("spec") is not None else None
    except SpecError as exc:
        raise ModelFileError(f"{path}: damaged model file ({exc}); {MAKE_ONE}") from None
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ModelFileError(f"{path}: damaged model file ({type(exc).__name__}: {exc}); {MAKE_ONE}") from None
    return ModelFile(path, step, dense, tables, spec)


def _tensor(t, dtype) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dtype != dtype:
        raise TypeError(f"expected a {dtype} tensor, found {getattr(t, 'dtype', type(t).__name__)}")
    return t


def _table(name: str, t: dict) -> LocalTable:
    ids = _tensor(t["ids"], torch.int64).numpy().view(np.uint64)
    rows = _tensor(t["rows"], torch.float32).numpy()
    if rows.ndim != 2 or rows.shape != (len(ids), t["dim"]):
        raise ValueError(f"table {name!r}: rows {list(rows.shape)} for {len(ids)} ids of dim {t['dim']}")
    if len(ids) > 1 and not (ids[1:] > ids[:-1]).all():
        raise ValueError(f"table {name!r}: ids are not sorted and distinct")
    admission = t["admission"]
    dtype = t.get("dtype", "float32")
    if dtype not in ROW_DTYPES:
        raise ValueError(f"table {name!r}: rows stored as {dtype!r}, not one of {', '.join(ROW_DTYPES)}")
    return LocalTable(name, ids, rows, int(t["seed"]), float(t["init_scale"]), int(admission["min_count"]),
                      float(admission["probability"]), dtype)


def load_model(module, path=None, unknown: str = "initial", classes: dict | None = None) -> torch.nn.Module:
    """Load an exported model file into ``module`` (the same nn.Module class that was
    trained), to run without any server: dense parameters are copied in by name, every
    SparseEmbedding reads its rows from the file. ``load_model(FILE)``: the module is built
    from the file's recorded model first (``build_from_file``). ``unknown``: what an id
    the table does not hold reads: "initial" (what the servers would give it in
    evaluation: its deterministic initial row) or "zeros". Names and shapes are checked
    first; every mismatch is named and nothing is changed. Returns the module."""
    if path is None:
        if isinstance(module, torch.nn.Module):
            raise ConfigError("load_model(module): pass the model file too, load_model(module, FILE)")
        return build_from_file(module, unknown, classes)
    if unknown not in UNKNOWN:
        raise ConfigError(f"load_model(unknown={unknown!r}): expected one of {UNKNOWN}")
    return _load_into(module, read_model(path), unknown)


def build_from_file(path, unknown: str = "initial", classes: dict | None = None) -> torch.nn.Module:
    """The module the file's spec describes (paramshard.models.build_model's, or one of
    ``classes``: name -> your class), built and loaded, with local tables: no code of the
    training script needed. ModelFileError when the file records no model."""
    if unknown not in UNKNOWN:
        raise ConfigError(f"load_model(unknown={unknown!r}): expected one of {UNKNOWN}")
    return build_module(read_model(path), classes, unknown)


def build_module(model: "ModelFile", classes: dict | None = None, unknown: str = "initial") -> torch.nn.Module:
    """build_from_file's work on a file already read (inference/portable.py builds one too)."""
    from paramshard.models import build_from_spec

    if model.spec is None:
        raise ModelFileError(f"{model.path}: this model file has no recorded model (its model was not built by "
                             f"paramshard.models.build_model and declares no paramshard_spec, or the file "
                             f"predates them): pass the module, ps.load_model(module, FILE)")
    _check_spec_fits(model, classes)
    return _load_into(build_from_spec(model.spec, classes=classes), model, unknown)


def _check_spec_fits(model: ModelFile, classes: dict | None) -> None:
    """The module the spec describes, built on the meta device (shapes, no memory), must
    have the file's parameters and tables: a spec whose sizes were made huge (args, hashed
    buckets) is refused here instead of being allocated."""
    from paramshard.models import MODELS, build_from_spec
    from paramshard.trainer.sparse_embedding import tables_of

    spec = model.spec
    assert spec is not None                # build_module refused a file without one
    embedding = None
    if "embedding" in spec:        # the hashed tables' shapes, without computing their initial rows
        buckets = spec["embedding"]["buckets"]
        embedding = lambda name, dim: torch.nn.EmbeddingBag(buckets, dim, mode="sum")    # noqa: E731
    about = f"its recorded model spec (model {spec['model']!r}, args {str(spec['args'])[:300]})"
    try:
        with torch.device("meta"):
            outline = build_from_spec(spec, embedding=embedding, classes=classes)
    except ConfigError:
        raise
    except Exception as exc:       # noqa: BLE001 - sizes no module can have (negative, past int64, ...)
        if spec["model"] in (classes or {}) and spec["model"] not in MODELS:
            return                 # your class: it may not build on the meta device; it is your code
        raise ModelFileError(f"{model.path}: {about} cannot be built ({type(exc).__name__}: {str(exc)[:200]}); "
                             f"the spec was damaged or edited: {MAKE_ONE}") from None
    problems = _mismatches(dict(outline.named_parameters()), tables_of(outline), model)
    if problems:
        raise ModelFileError(f"{model.path}: {about} does not fit the tensors the file holds (\"here\": as the "
                             f"spec builds it): " + "; ".join(problems[:5]) +
                             f"; the spec or the tensors were changed after export: {MAKE_ONE}")


def _load_into(module: torch.nn.Module, model: ModelFile, unknown: str) -> torch.nn.Module:
    from paramshard.trainer.sparse_embedding import tables_of

    params = dict(module.named_parameters())
    tables = tables_of(module)
    problems = _mismatches(params, tables, model)
    if problems:
        raise ModelFileError(f"{model.path} does not fit this model: " + "; ".join(problems))
    with torch.no_grad():
        for name, value in model.dense.items():
            params[name].copy_(value)
    for name, table in tables.items():
        table.attach(model.tables[name].row_source(unknown), trainable=False)
    return module


def _mismatches(params: dict, tables: dict, model: ModelFile) -> list[str]:
    where = model.path.name
    # A frozen parameter never reached the servers: the module's own value stands.
    problems = [f"parameter {n} is not in {where}" for n, p in params.items()
                if p.requires_grad and n not in model.dense]
    problems += [f"{where}'s parameter {n} is not in this model" for n in model.dense if n not in params]
    problems += [f"parameter {n} is {list(params[n].shape)} here, {list(v.shape)} in {where}"
                 for n, v in model.dense.items() if n in params and params[n].shape != v.shape]
    problems += [f"sparse table {n!r} is not in {where}" for n in tables if n not in model.tables]
    problems += [f"{where}'s sparse table {n!r} is not in this model" for n in model.tables if n not in tables]
    problems += [f"sparse table {n!r} is dim {t.dim} here, dim {model.tables[n].dim} in {where}"
                 for n, t in tables.items() if n in model.tables and t.dim != model.tables[n].dim]
    return problems
