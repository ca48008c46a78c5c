"""The manifest's schema: every field a reader uses, checked before any of it is used.

A manifest is data from disk. A damaged or hostile one must end in one
CheckpointError naming the field, not in a KeyError deep inside a restore, and
its sizes must hold together before any array is read: each file's dtype and
shape fit in its byte count, and each dense parameter's and sparse table's
files have the shapes the entry implies. Then a reader that also checks every
.npy header against its manifest entry and the file's real size
(checkpoint/npy.py) never allocates more than the checkpoint holds.

Fields no reader uses (created, mode, plan, ...) are type-checked when present
and otherwise left alone.
"""
from __future__ import annotations

import math
import re

from paramshard.errors import ConfigError, ProtocolError
from paramshard.checkpoint.errors import CheckpointError
from paramshard.checkpoint.paths import relpath_problem
from paramshard.checkpoint.manifest_schema import Invalid, array, integer, lr_scale, obj, show, text

FORMAT = "paramshard-checkpoint"
FORMAT_VERSION = 1

# dtype.str of every array the writer produces: float32 values and slots, uint64 ids,
# int64 steps / last-seen versions / admission counts (uint32 in the servers' memory).
DTYPES = {"<f4": 4, "<u8": 8, "<i8": 8, "<u4": 4}
_COUNTERS = ("<i8", "<u4")
_ROW_PARTS = {"ids": ("<u8",), "values": ("<f4",), "steps": _COUNTERS, "last_seen": _COUNTERS}
_COUNT_PARTS = {"counted_ids": ("<u8",), "counts": _COUNTERS}
_SLOT = re.compile(r"slot[0-9]{1,2}")
MAX_NDIM = 8


def _shape(value, what: str) -> list[int]:
    array(value, what)
    if len(value) > MAX_NDIM:
        raise Invalid(f"{what} has {len(value)} dimensions, at most {MAX_NDIM}")
    return [integer(n, f"{what}[{i}]") for i, n in enumerate(value)]


def check_file(relpath, meta) -> None:
    """One entry of ``files``: a plain relative name, and a dtype and shape whose data fits
    in the byte count (so reading it can never need more memory than the file holds)."""
    problem = relpath_problem(relpath)
    if problem:
        raise Invalid(f"file entry {show(relpath)} {problem}")
    what = f"file entry {relpath!r}"
    obj(meta, what, ("bytes", "crc32", "dtype", "shape"))
    nbytes = integer(meta["bytes"], f"{what}: bytes")
    integer(meta["crc32"], f"{what}: crc32", 0, 0xFFFFFFFF)
    if meta["dtype"] not in DTYPES:
        raise Invalid(f"{what}: dtype {show(meta['dtype'])} is not one a checkpoint holds {sorted(DTYPES)}")
    shape = _shape(meta["shape"], f"{what}: shape")
    needed = math.prod(shape) * DTYPES[meta["dtype"]]
    if needed > nbytes:
        raise Invalid(f"{what}: shape {shape} of {meta['dtype']} needs {needed} bytes, the file has {nbytes}")


def _file_of(files: dict, relpath, what: str, dtypes: tuple, shape: list[int] | None) -> list[int]:
    """A file an entry points at: listed in ``files``, with the dtype and shape the entry
    implies (``shape`` None: any one-dimensional shape). Returns its shape."""
    if not isinstance(relpath, str):
        raise Invalid(f"{what} must be a file name, got {show(relpath)}")
    meta = files.get(relpath)
    if meta is None:
        raise Invalid(f"{what}: the manifest lists no file {relpath!r} (incomplete checkpoint)")
    if meta["dtype"] not in dtypes or (meta["shape"] != shape if shape is not None else len(meta["shape"]) != 1):
        raise Invalid(f"{what}: {relpath!r} is {meta['dtype']}{meta['shape']}, expected "
                      f"{'/'.join(dtypes)}{shape if shape is not None else '[n]'}")
    return meta["shape"]


def check_dense(entry, i: int, files: dict) -> str:
    what = f"dense[{i}]"
    obj(entry, what, ("name", "shape", "version", "files"))
    name = text(entry["name"], f"{what}: name")
    what = f"dense parameter {name!r}"
    numel = math.prod(_shape(entry["shape"], f"{what}: shape"))
    integer(entry["version"], f"{what}: version")
    parts = obj(entry["files"], f"{what}: files", ("values", "slots"))
    _file_of(files, parts["values"], f"{what}: values", ("<f4",), [numel])
    for j, slot in enumerate(array(parts["slots"], f"{what}: slots")):
        _file_of(files, slot, f"{what}: slot {j}", ("<f4",), [numel])
    return name


def check_sparse(entry, i: int, files: dict) -> str:
    from paramshard.optim import from_wire                  # the readers' own checks, not a copy of them
    from paramshard.tables import check_row_format, check_table_settings, policy_from_wire
    from paramshard.update_rules import make_rule

    what = f"sparse[{i}]"
    obj(entry, what, ("name", "dim", "seed", "init_scale", "optimizer", "policy", "rows", "version",
                        "evicted", "files"))
    name = text(entry["name"], f"{what}: name")
    what = f"sparse table {name!r}"
    try:
        check_table_settings(name, entry["dim"], entry["seed"], entry["init_scale"])
        optimizer = from_wire(entry["optimizer"])
        policy_from_wire(entry["policy"])
        # How the servers stored the rows (the files hold float32 either way); a checkpoint
        # written before half rows existed has neither: float32, nearest.
        check_row_format(name, entry.get("dtype", "float32"), entry.get("rounding", "nearest"))
    except ConfigError as exc:
        raise Invalid(f"{what}: {exc}") from None
    rows, dim = integer(entry["rows"], f"{what}: rows"), entry["dim"]
    widths = make_rule(optimizer).slot_widths(dim)     # per row: dim, or 1 for a per-row accumulator
    integer(entry["version"], f"{what}: version")
    integer(entry["evicted"], f"{what}: evicted")
    if "lr_scale" in entry:
        lr_scale(entry["lr_scale"], f"{what}: lr_scale")
    parts = obj(entry["files"], f"{what}: files", ("ids", "values"))
    for part, relpath in parts.items():
        where = f"{what}: {part}"
        if part in _ROW_PARTS:
            _file_of(files, relpath, where, _ROW_PARTS[part], [rows, dim] if part == "values" else [rows])
        elif _SLOT.fullmatch(part):
            j = int(part[4:])
            if j >= len(widths):
                raise Invalid(f"{what}: files has {part!r}, but {optimizer.kind} keeps {len(widths)} state "
                              f"array{'s' if len(widths) != 1 else ''} per row")
            _file_of(files, relpath, where, ("<f4",), [rows, widths[j]])
        elif part not in _COUNT_PARTS:
            raise Invalid(f"{what}: files has {show(part)}, not a part of a table "
                          f"(ids, values, slotN, steps, last_seen, counted_ids, counts)")
    if set(_COUNT_PARTS) & set(parts):      # admission counters: one count per counted id
        if set(_COUNT_PARTS) - set(parts):
            raise Invalid(f"{what}: files has {sorted(set(_COUNT_PARTS) & set(parts))[0]!r} without "
                          f"{sorted(set(_COUNT_PARTS) - set(parts))[0]!r}")
        counted = _file_of(files, parts["counted_ids"], f"{what}: counted_ids", _COUNT_PARTS["counted_ids"], None)
        _file_of(files, parts["counts"], f"{what}: counts", _COUNT_PARTS["counts"], counted)
    return name


def _check_optional(manifest: dict) -> None:
    for key in ("created", "mode", "dispatch"):
        if key in manifest:
            text(manifest[key], key)
    for key in ("servers", "trainers"):
        if key in manifest:
            integer(manifest[key], key, 1)
    if manifest.get("job_id") is not None and not isinstance(manifest["job_id"], str):
        raise Invalid(f"job_id must be a string, got {show(manifest['job_id'])}")
    if manifest.get("optimizer") is not None:
        from paramshard.optim import from_wire
        try:
            from_wire(manifest["optimizer"])
        except ConfigError as exc:
            raise Invalid(f"optimizer: {exc}") from None
    if "lr_scale" in manifest:
        lr_scale(manifest["lr_scale"], "lr_scale")
    if "plan" in manifest:
        obj(manifest["plan"], "plan")
    if manifest.get("model") is not None:      # what built the model (specs/model_spec.py); older ones have none
        from paramshard.specs.model_spec import SpecError, check_spec
        try:
            check_spec(manifest["model"])
        except SpecError as exc:
            raise Invalid(f"model: {exc}") from None
    if "routing" in manifest:       # an elastic job's routing the checkpoint was taken under
        from paramshard.placement.partitions import Routing
        try:
            Routing.from_wire(obj(manifest["routing"], "routing"))
        except (ProtocolError, ValueError, TypeError, KeyError) as exc:
            raise Invalid(f"routing: {exc}") from None
    for trainer, step in obj(manifest.get("cut", {}), "cut").items():
        if not re.fullmatch(r"[0-9]{1,9}", trainer):
            raise Invalid(f"cut: {show(trainer)} is not a trainer number")
        integer(step, f"cut[{trainer}]", -1)


def check_manifest(manifest, where) -> dict:
    """``manifest`` (parsed JSON of the file ``where``) when it follows the schema;
    otherwise one CheckpointError naming the field at fault."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{where}: not a paramshard checkpoint manifest")
    if manifest.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"{where}: format version {show(manifest.get('version'))}, this paramshard reads "
                              f"version {FORMAT_VERSION}")
    try:
        obj(manifest, "the manifest", ("step", "files", "dense", "sparse"))
        integer(manifest["step"], "step")
        files = obj(manifest["files"], "files")
        for relpath, meta in files.items():
            check_file(relpath, meta)
        for kind, check in (("dense", check_dense), ("sparse", check_sparse)):
            seen = set()
            for i, entry in enumerate(array(manifest[kind], kind)):
                name = check(entry, i, files)
                if name in seen:
                    raise Invalid(f"{kind} lists {name!r} twice")
                seen.add(name)
        _check_optional(manifest)
    except Invalid as exc:
        raise CheckpointError(f"{where}: {exc} (a damaged checkpoint, or not written by paramshard: "
                              f"use another one)") from None
    return manifest
