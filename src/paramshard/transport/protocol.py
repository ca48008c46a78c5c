"""Message schema: a msgpack header frame followed by raw little-endian array frames.

A request is ``[header, frame, ...]``; the header carries the protocol version,
op code, request id, op fields, and one ``{"dtype", "shape"}`` entry per frame.
Nothing here trusts the peer: every field is checked before use and a bad
message raises ProtocolError with a sentence naming what is wrong.
"""
from __future__ import annotations

import math
from typing import Any, Sequence, TypeGuard

import msgpack
import numpy as np

from paramshard.budgets import MAX_BUDGET, MIN_BUDGET
from paramshard import json_value
from paramshard.errors import ConfigError, ProtocolError
from paramshard.tables import ROUNDINGS, ROW_DTYPES

PROTOCOL_VERSION = 1

# Wire dtypes: explicit little-endian so a big-endian peer could still talk to us.
DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
    "int32": np.dtype("<i4"),
    "int64": np.dtype("<i8"),
    "uint64": np.dtype("<u8"),
}
MAX_HEADER_BYTES = 1 << 20
MAX_DIMS = 32                 # numpy's own limit in 1.x
MAX_ARRAY_BYTES = 1 << 62     # any frame is far smaller; a shape past this is nonsense

# op -> {field: type}; fields every request has (v, op, id, arrays) are implied.
# A type wrapped in Optional may be left out; when present it is checked the same way.
_STR_LIST, _INT_LIST = "str_list", "int_list"
_BUDGET = "a memory budget in bytes (budgets.py: at least MIN_BUDGET)"
JSON_VALUE = "a small JSON value (json_value.py)"


class Optional:
    """A request field that may be absent (the handler picks the default)."""
    __slots__ = ("kind",)

    def __init__(self, kind: Any):
        self.kind = kind

    def __repr__(self) -> str:
        return f"Optional({self.kind!r})"


class OneOf:
    """A string field that must be one of a few names."""
    __slots__ = ("names",)

    def __init__(self, *names: str):
        self.names = names

    def __repr__(self) -> str:
        return f"OneOf{self.names!r}"


REQUEST_FIELDS: dict[str, dict[str, Any]] = {
    "hello": {},
    "stats": {},
    "register_dense": {"names": _STR_LIST, "optimizer": dict, "plan_fingerprint": int, "trainer": int},
    "pull_dense": {"names": _STR_LIST, "min_version": int, "plan_fingerprint": int, "epoch": Optional(int),
                   "routing": Optional(int), "resume_step": Optional(int)},
    "push_dense": {"names": _STR_LIST, "step": int, "trainer": int, "reply_values": bool, "epoch": Optional(int),
                   "resume_step": Optional(int), "routing": Optional(int)},
    "register_sparse": {"table": str, "dim": int, "seed": int, "optimizer": dict, "policy": dict,
                        "trainer": int, "reserve": Optional(int), "dtype": Optional(OneOf(*ROW_DTYPES)),
                        "rounding": Optional(OneOf(*ROUNDINGS)), "memory_budget": Optional(_BUDGET)},
    "pull_sparse": {"table": str, "trainer": int, "min_version": int, "create": Optional(bool),
                    "epoch": Optional(int), "routing": Optional(int)},
    "push_sparse": {"table": str, "step": int, "trainer": int, "distinct": Optional(bool), "epoch": Optional(int),
                    "routing": Optional(int)},
    "export_sparse": {"table": str},
    "import_sparse": {"table": str},
    "snapshot_dense": {},
    "snapshot_sparse": {"table": str, "start": int, "count": int, "min_version": Optional(int)},
    "restore_dense": {"names": _STR_LIST, "versions": _INT_LIST, "slots": int, "optimizer": dict,
                      "plan_fingerprint": int, "trainer": int, "lr_scale": Optional(float)},
    "restore_sparse": {"table": str, "parts": _STR_LIST, "version": int, "evicted": int, "trainer": int,
                       "reserve": Optional(int), "lr_scale": Optional(float)},
    "replica_delta": {"since": int},
    "replica_resume": {"epoch": int, "steps": dict},
    "pause_pushes": {},
    "cut_pushes": {"cut": list, "skip": Optional(list)},
    "resume_pushes": {},
    "exclude_begin": {"who": OneOf("checkpoint", "move"), "trainer": Optional(int), "after_step": Optional(int)},
    "exclude_end": {"who": OneOf("checkpoint", "move"), "trainer": Optional(int)},
    "reset": {"epoch": int, "trainer": int},
    "leave": {"trainer": int},
    "join": {"trainer": int, "first_step": Optional(int)},
    "barrier": {"name": str, "count": int, "trainer": int, "epoch": Optional(int), "resumed": Optional(bool),
                "broadcast": Optional(bool), "value": Optional(JSON_VALUE)},
    "scale_lr": {"factor": float, "dense": bool, "tables": _STR_LIST, "trainer": int, "min_version": Optional(int),
                 "epoch": Optional(int)},
    "shutdown": {},
    # the data-shard service (server/elastic/shard_service.py); sizes are checked by server/elastic/shard_queue.py
    "shard_register": {"trainer": int, "pass": int, "fingerprint": str, "files": _STR_LIST, "tasks": list,
                       "step": Optional(int), "session": Optional(str), "epoch": Optional(int)},
    "shard_next": {"trainer": int, "pass": int, "step": Optional(int), "epoch": Optional(int)},
    "shard_progress": {"trainer": int, "pass": int, "step": int, "task": int, "position": int, "done": bool,
                       "epoch": Optional(int), "lease": Optional(int)},
    "shard_snapshot": {"trainer": int, "after": Optional(list), "epoch": Optional(int)},
    "shard_restore": {"trainer": int, "state": dict, "epoch": Optional(int)},
    # Moving sparse partitions between servers (server/elastic/migration_service.py, launch/elastic/server_scaling.py).
    "routing_get": {},
    "routing_set": {"routing": dict, "join": Optional(bool), "restored": Optional(bool)},
    "migrate_switch": {"step": int, "version": int},
    "migrate_tables": {},
    "migrate_tables_in": {"tables": list},
    "migrate_start": {"partitions": _INT_LIST},
    "migrate_expect": {"partitions": _INT_LIST},
    "migrate_page": {"table": str, "start": int, "count": int},
    "migrate_stage": {"table": str, "parts": _STR_LIST},
    "handoff_freeze": {"partitions": _INT_LIST},
    "handoff_rows": {"table": str, "partitions": _INT_LIST},
    "handoff_in": {"table": str, "parts": _STR_LIST, "version": Optional(int)},
    "handoff_done": {"partitions": _INT_LIST},
    "migrate_finish": {},
    "migrate_abort": {"partitions": _INT_LIST, "names": _STR_LIST},
    "handoff_undo": {"partitions": _INT_LIST, "names": _STR_LIST},
    # Moving dense blocks (server/elastic/dense_migration.py).
    "dense_held": {},
    "dense_expect": {"names": _STR_LIST},
    "dense_freeze": {"names": _STR_LIST},
    "dense_export": {"names": _STR_LIST},
    "dense_import": {"names": _STR_LIST, "versions": _INT_LIST, "slots": int, "optimizer": dict,
                     "plan_fingerprint": int, "lr_scale": float, "clocks": Optional(list)},
    "dense_finish": {},
    "retire": {"exit": Optional(bool)},
}


def _is_int(value: Any) -> TypeGuard[int]:
    """An integer on the wire: bool is an int subclass in Python, and never counts."""
    return isinstance(value, int) and not isinstance(value, bool)


def _check_field(op: str, name: str, value: Any, kind: Any) -> None:
    if isinstance(kind, OneOf):
        if not isinstance(value, str) or value not in kind.names:
            raise ProtocolError(f"{op}: field {name!r} must be one of {', '.join(kind.names)}, got {value!r}"[:300])
        return
    if kind == _STR_LIST:
        ok = isinstance(value, list) and all(isinstance(x, str) for x in value)
    elif kind == _INT_LIST:
        ok = isinstance(value, list) and all(_is_int(x) for x in value)
    elif kind == _BUDGET:
        ok = _is_int(value) and MIN_BUDGET <= value <= MAX_BUDGET
    elif kind == JSON_VALUE:
        try:
            json_value.encoded(value, f"{op}: field {name!r}")
        except ConfigError as exc:
            raise ProtocolError(str(exc)[:300]) from None
        return
    elif kind is int:
        ok = _is_int(value)
    else:
        ok = isinstance(value, kind)
    if not ok:
        want = kind if isinstance(kind, str) else kind.__name__
        raise ProtocolError(f"{op}: field {name!r} must be {want}, got {type(value).__name__}")


def array_meta(arr: np.ndarray) -> dict:
    for name, dt in DTYPES.items():
        if arr.dtype == dt:
            return {"dtype": name, "shape": list(arr.shape)}
    raise ProtocolError(f"dtype {arr.dtype} cannot travel on the wire; use one of {sorted(DTYPES)}")


def encode(header: dict, arrays: Sequence[np.ndarray] = ()) -> list:
    """Header dict + arrays -> frames ready for send_multipart(copy=False)."""
    header = dict(header)
    header["v"] = PROTOCOL_VERSION
    header["arrays"] = [array_meta(a) for a in arrays]
    frames: list = [msgpack.packb(header, use_bin_type=True)]
    for a in arrays:
        # memoryview of a contiguous array: zmq sends it without copying.
        flat = np.ascontiguousarray(a).reshape(-1)
        frames.append(flat.data.cast("B") if flat.size else b"")
    return frames


def _unpack(raw: bytes | memoryview):
    if len(raw) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header is {len(raw)} bytes, more than the {MAX_HEADER_BYTES} allowed")
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=True, max_bin_len=0, max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"header is not valid msgpack ({exc.__class__.__name__}: {exc})") from None


def decode_header(raw: bytes | memoryview) -> dict:
    header = _unpack(raw)
    if not isinstance(header, dict):
        raise ProtocolError(f"header must be a map, got {type(header).__name__}")
    version = header.get("v")
    # type() rather than ==: True == 1 and 1.0 == 1 in Python, neither is version 1.
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {version!r} is not supported "
                            f"(this side speaks {PROTOCOL_VERSION}); run the same paramshard everywhere")
    if not _is_int(header.get("id")):
        raise ProtocolError("header has no integer request 'id'")
    if not isinstance(header.get("arrays"), list):
        raise ProtocolError("header has no 'arrays' list")
    return header


def request_id_of(raw: bytes | memoryview) -> int:
    """Best effort: the request id of a raw header frame, or -1 when it cannot be read.

    For error replies: a request that fails decode_header or validate_request
    later (bad version, unknown op, bad field) still gets its id back, so the
    client can match the error to the request it sent. Never raises.
    """
    try:
        header = _unpack(raw)
    except ProtocolError:
        return -1
    request_id = header.get("id") if isinstance(header, dict) else None
    return request_id if _is_int(request_id) else -1


def validate_request(header: dict) -> None:
    op = header.get("op")
    if not isinstance(op, str) or op not in REQUEST_FIELDS:
        raise ProtocolError(f"unknown op {op!r}; known ops: {', '.join(REQUEST_FIELDS)}")
    fields = REQUEST_FIELDS[op]
    for name, kind in fields.items():
        if isinstance(kind, Optional):
            if name in header:
                _check_field(op, name, header[name], kind.kind)
            continue
        if name not in header:
            raise ProtocolError(f"{op}: missing field {name!r}")
        _check_field(op, name, header[name], kind)


def decode_arrays(header: dict, frames: Sequence) -> list[np.ndarray]:
    """Views (no copy) over the received frames, checked against the header."""
    metas = header["arrays"]
    if len(metas) != len(frames):
        raise ProtocolError(f"header announces {len(metas)} array frames but {len(frames)} arrived")
    out = []
    for i, (meta, frame) in enumerate(zip(metas, frames)):
        if not isinstance(meta, dict) or not isinstance(meta.get("dtype"), str) or meta["dtype"] not in DTYPES:
            raise ProtocolError(f"array {i}: dtype must be one of {sorted(DTYPES)}, got {meta!r}")
        shape = meta.get("shape")
        if not (isinstance(shape, list) and all(_is_int(d) and d >= 0 for d in shape)):
            raise ProtocolError(f"array {i}: shape must be a list of non-negative ints, got {shape!r}")
        if len(shape) > MAX_DIMS:
            raise ProtocolError(f"array {i}: {len(shape)} dimensions, more than the {MAX_DIMS} allowed")
        dtype = DTYPES[meta["dtype"]]
        # numpy refuses (ValueError) a shape whose non-zero dimensions overflow,
        # even when a zero makes the array empty: say so before it gets there.
        if math.prod(d for d in shape if d) * dtype.itemsize > MAX_ARRAY_BYTES:
            raise ProtocolError(f"array {i}: shape {shape} is too large")
        buf = frame.buffer if hasattr(frame, "buffer") else memoryview(frame)
        expected = math.prod(shape) * dtype.itemsize
        if buf.nbytes != expected:
            raise ProtocolError(f"array {i}: {meta['dtype']}{shape} needs {expected} bytes, frame has {buf.nbytes}")
        out.append(np.frombuffer(buf, dtype=dtype).reshape(shape))
    return out


def error_header(request_id: int, code: str, message: str) -> dict:
    return {"op": "reply", "id": request_id, "ok": False, "code": code, "message": message}


def ok_header(request_id: int, **fields) -> dict:
    return {"op": "reply", "id": request_id, "ok": True, **fields}
