"""Message schema: a msgpack header frame followed by raw little-endian array frames.

A request is ``[header, frame, ...]``; the header carries the protocol version,
op code, request id, op fields, and one ``{"dtype", "shape"}`` entry per frame.
Nothing here trusts the peer: every field is checked before use and a bad
message raises ProtocolError with a sentence naming what is wrong.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import msgpack
import numpy as np

from ..errors import ProtocolError

PROTOCOL_VERSION = 1

# Wire dtypes: explicit little-endian so a big-endian peer could still talk to us.
DTYPES = {
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
    "int32": np.dtype("<i4"),
    "int64": np.dtype("<i8"),
    "uint64": np.dtype("<u8"),
}
MAX_HEADER_BYTES = 1 << 20

# op -> {field: type}; fields every request has (v, op, id, arrays) are implied.
_STR_LIST, _INT_LIST = "str_list", "int_list"
REQUEST_FIELDS: dict[str, dict[str, Any]] = {
    "hello": {},
    "stats": {},
    "register_dense": {"names": _STR_LIST, "optimizer": dict, "plan_fingerprint": int},
    "pull_dense": {"names": _STR_LIST, "min_version": int, "plan_fingerprint": int},
    "push_dense": {"names": _STR_LIST, "step": int, "trainer": int, "reply_values": bool},
    "register_sparse": {"table": str, "dim": int, "seed": int, "optimizer": dict, "policy": dict},
    "pull_sparse": {"table": str, "trainer": int, "min_version": int},
    "push_sparse": {"table": str, "step": int, "trainer": int},
    "export_sparse": {"table": str},
    "import_sparse": {"table": str},
    "leave": {"trainer": int},
    "shutdown": {},
}


def _check_field(op: str, name: str, value: Any, kind: Any) -> None:
    if kind == _STR_LIST:
        ok = isinstance(value, list) and all(isinstance(x, str) for x in value)
    elif kind == _INT_LIST:
        ok = isinstance(value, list) and all(isinstance(x, int) for x in value)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
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


def encode(header: dict, arrays: Sequence[np.ndarray] = (), signed: bool = False) -> list:
    """Header dict + arrays -> frames ready for send_multipart(copy=False)."""
    header = dict(header)
    header["v"] = PROTOCOL_VERSION
    if signed:
        header["signed"] = True
    header["arrays"] = [array_meta(a) for a in arrays]
    frames: list = [msgpack.packb(header, use_bin_type=True)]
    for a in arrays:
        # memoryview of a contiguous array: zmq sends it without copying.
        flat = np.ascontiguousarray(a).reshape(-1)
        frames.append(memoryview(flat).cast("B") if flat.size else b"")
    return frames


def decode_header(raw: bytes | memoryview) -> dict:
    if len(raw) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header is {len(raw)} bytes, more than the {MAX_HEADER_BYTES} allowed")
    try:
        header = msgpack.unpackb(raw, raw=False, strict_map_key=True, max_bin_len=0,
                                 max_ext_len=0)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"header is not valid msgpack ({exc.__class__.__name__}: {exc})") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"header must be a map, got {type(header).__name__}")
    if header.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {header.get('v')!r} is not supported "
                            f"(this side speaks {PROTOCOL_VERSION}); run the same paramshard everywhere")
    if not isinstance(header.get("id"), int):
        raise ProtocolError("header has no integer request 'id'")
    if not isinstance(header.get("arrays"), list):
        raise ProtocolError("header has no 'arrays' list")
    return header


def validate_request(header: dict) -> None:
    op = header.get("op")
    fields = REQUEST_FIELDS.get(op) if isinstance(op, str) else None
    if fields is None:
        raise ProtocolError(f"unknown op {op!r}; known ops: {', '.join(REQUEST_FIELDS)}")
    for name, kind in fields.items():
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
        if not isinstance(meta, dict) or meta.get("dtype") not in DTYPES:
            raise ProtocolError(f"array {i}: dtype must be one of {sorted(DTYPES)}, got {meta!r}")
        shape = meta.get("shape")
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise ProtocolError(f"array {i}: shape must be a list of non-negative ints, got {shape!r}")
        dtype = DTYPES[meta["dtype"]]
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
