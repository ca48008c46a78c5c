"""One delta or snapshot file: what a server changed since its previous one, readable with numpy.

A training job's servers publish what they changed every N seconds or M updates (a *delta*) and,
every K deltas, all they hold (a *snapshot*), so a serving replica follows the model while it
learns. One file is::

    b"PSDELTA1"                    8 bytes, the magic (its last byte is the format version)
    header length                  uint32, little-endian
    header                         that many bytes of UTF-8 JSON (below)
    payload                        the arrays, each at a 64-byte aligned offset into the payload

The header::

    {"format": "paramshard-delta", "version": 1,
     "kind": "delta" | "snapshot",
     "server": 0,                  # the server that wrote it (each server has its own sequence)
     "seq": 12,                    # 1, 2, ... per server; a snapshot carries the seq of the last
                                   # delta it includes (its state equals base + deltas 1..seq)
     "step": 340,                  # the server's progress when it was taken (sync: completed steps)
     "created": 1764412345.2,      # unix seconds (freshness, not ordering)
     "tables": {"deep": {"dim": 16, "rows": 812, "tombstones": 3, "dtype": "float16",
                         "version": 340}},
     "dense": {"mlp.0.weight.block0": {"elements": 8192}},
     "arrays": [{"name": "tables/deep/ids", "dtype": "<u8", "shape": [812], "offset": 0}, ...],
     "payload_bytes": 53312, "payload_sha256": "..."}

Arrays: ``tables/T/ids`` (uint64, the rows' ids), ``tables/T/values`` (float32 or float16
[rows, dim], the rows' values; float16 only when the writer was asked to quantise),
``tables/T/tombstones`` (uint64, ids the server no longer holds: evicted or dropped, never ids that
moved to another server), ``dense/NAME`` (float32 [elements], a dense block's values, present only
when it changed more than the writer's threshold). A snapshot has no tombstones: what it does not
hold is absent.

Reading checks everything before it allocates: the magic, the header's size (<= MAX_HEADER) and
schema, every array's dtype, shape and offset inside the payload, the payload's length against the
file's and its SHA-256. A file that fails is a ``DeltaError`` naming the file and the field; no
pickle anywhere (np.frombuffer on the checked bytes).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import struct
from pathlib import Path

import numpy as np

from paramshard.errors import ConfigError

MAGIC = b"PSDELTA1"
FORMAT = "paramshard-delta"
VERSION = 1
KINDS = ("delta", "snapshot")
ALIGN = 64
MAX_HEADER = 16 << 20                 # bytes of header JSON (a million arrays would not reach it)
VALUE_DTYPES = {"float32": "<f4", "float16": "<f2"}
ARRAY_DTYPES = ("<u8", "<f4", "<f2")
_LENGTH = struct.Struct("<I")


class DeltaError(ConfigError):
    """A delta or snapshot file that is damaged, truncated, of another format or another version."""


@dataclasses.dataclass
class TableChange:
    """One table's part of a delta: rows set (ids, values) and ids removed (tombstones)."""
    ids: np.ndarray                     # uint64 [n]
    values: np.ndarray                  # float32 or float16 [n, dim]
    tombstones: np.ndarray              # uint64 [m]
    version: int = 0                    # the table's version when the delta was taken

    @property
    def dim(self) -> int:
        return int(self.values.shape[1])


@dataclasses.dataclass
class Delta:
    kind: str                           # "delta" or "snapshot"
    server: int
    seq: int
    step: int
    created: float
    tables: dict[str, TableChange]
    dense: dict[str, np.ndarray]        # block name -> float32 [elements]

    def row_bytes(self) -> int:
        """Bytes of row values and ids this delta carries (what its size should be close to)."""
        return sum(t.ids.nbytes + t.values.nbytes + t.tombstones.nbytes for t in self.tables.values())


def encode(delta: Delta) -> bytes:
    """The file's bytes for ``delta`` (values kept in the dtype they have: float32 or float16)."""
    if delta.kind not in KINDS:
        raise ValueError(f"kind {delta.kind!r}: expected one of {KINDS}")
    arrays: list[tuple[str, np.ndarray]] = []
    tables = {}
    for name, change in delta.tables.items():
        values = np.ascontiguousarray(change.values)
        if values.ndim != 2 or values.dtype not in (np.float32, np.float16):
            raise ValueError(f"table {name}: values must be float32 or float16 [rows, dim], got "
                             f"{values.dtype} {values.shape}")
        ids = np.ascontiguousarray(change.ids, dtype="<u8")
        if len(ids) != len(values):
            raise ValueError(f"table {name}: {len(ids)} ids for {len(values)} rows")
        tombstones = np.ascontiguousarray(change.tombstones, dtype="<u8")
        if delta.kind == "snapshot" and len(tombstones):
            raise ValueError(f"table {name}: a snapshot holds no tombstones")
        tables[name] = {"dim": int(values.shape[1]), "rows": len(ids), "tombstones": len(tombstones),
                        "dtype": "float16" if values.dtype == np.float16 else "float32",
                        "version": int(change.version)}
        arrays += [(f"tables/{name}/ids", ids), (f"tables/{name}/values", values.astype(values.dtype.newbyteorder("<"), copy=False)),
                   (f"tables/{name}/tombstones", tombstones)]
    dense = {}
    for name, values in delta.dense.items():
        values = np.ascontiguousarray(values, dtype="<f4").reshape(-1)
        dense[name] = {"elements": len(values)}
        arrays.append((f"dense/{name}", values))
    entries, chunks, offset = [], [], 0
    for name, array in arrays:
        pad = -offset % ALIGN
        if pad:
            chunks.append(b"\0" * pad)
            offset += pad
        entries.append({"name": name, "dtype": array.dtype.str, "shape": list(array.shape), "offset": offset})
        data = array.tobytes()
        chunks.append(data)
        offset += len(data)
    payload = b"".join(chunks)
    header = {"format": FORMAT, "version": VERSION, "kind": delta.kind, "server": int(delta.server),
              "seq": int(delta.seq), "step": int(delta.step), "created": float(delta.created),
              "tables": tables, "dense": dense, "arrays": entries,
              "payload_bytes": len(payload), "payload_sha256": hashlib.sha256(payload).hexdigest()}
    head = json.dumps(header, separators=(",", ":")).encode()
    return MAGIC + _LENGTH.pack(len(head)) + head + payload


def decode(data: bytes, where: str = "delta") -> Delta:
    """The Delta in ``data`` (a whole file's bytes), after checking all of it."""
    fixed = len(MAGIC) + _LENGTH.size
    if len(data) < fixed or data[:len(MAGIC) - 1] != MAGIC[:-1]:
        raise DeltaError(f"{where}: not a paramshard delta (no {MAGIC[:-1]!r} magic)")
    if data[len(MAGIC) - 1:len(MAGIC)] != MAGIC[-1:]:
        raise DeltaError(f"{where}: delta format version {data[len(MAGIC) - 1:len(MAGIC)]!r}, this paramshard "
                         f"reads {MAGIC[-1:]!r}: read it with the paramshard that wrote it")
    (head_len,) = _LENGTH.unpack_from(data, len(MAGIC))
    if head_len > MAX_HEADER or fixed + head_len > len(data):
        raise DeltaError(f"{where}: header of {head_len} bytes does not fit the file ({len(data)} bytes)")
    try:
        header = json.loads(data[fixed:fixed + head_len].decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise DeltaError(f"{where}: header is not JSON ({exc})") from None
    payload = memoryview(data)[fixed + head_len:]
    _check_header(header, len(payload), where)
    if hashlib.sha256(payload).hexdigest() != header["payload_sha256"]:
        raise DeltaError(f"{where}: payload checksum differs (a damaged or truncated file)")
    arrays = {}
    for entry in header["arrays"]:
        dtype = np.dtype(entry["dtype"])
        count = math.prod(entry["shape"])
        arrays[entry["name"]] = np.frombuffer(payload, dtype, count, entry["offset"]).reshape(entry["shape"])
    tables = {}
    for name, info in header["tables"].items():
        ids, values = arrays.get(f"tables/{name}/ids"), arrays.get(f"tables/{name}/values")
        tombstones = arrays.get(f"tables/{name}/tombstones")
        if ids is None or values is None or tombstones is None:
            raise DeltaError(f"{where}: table {name} lacks its ids, values or tombstones array")
        if (ids.shape != (info["rows"],) or values.shape != (info["rows"], info["dim"])
                or values.dtype != np.dtype(VALUE_DTYPES[info["dtype"]]) or tombstones.shape != (info["tombstones"],)):
            raise DeltaError(f"{where}: table {name}'s arrays do not match its header entry {info}")
        tables[name] = TableChange(ids, values, tombstones, info["version"])
    dense = {}
    for name, info in header["dense"].items():
        values = arrays.get(f"dense/{name}")
        if values is None or values.shape != (info["elements"],) or values.dtype != np.dtype("<f4"):
            raise DeltaError(f"{where}: dense block {name} does not match its header entry {info}")
        dense[name] = values
    return Delta(header["kind"], header["server"], header["seq"], header["step"], header["created"], tables, dense)


def read_delta(path) -> Delta:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DeltaError(f"{path}: cannot read ({exc.strerror})") from None
    return decode(data, str(path))


def _integer(value, what: str, where: str, low: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise DeltaError(f"{where}: {what} must be an integer >= {low}, got {value!r}")


def _check_header(header, payload_bytes: int, where: str) -> None:
    """Every field a reader uses, before any array is made from the payload."""
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise DeltaError(f"{where}: header names no {FORMAT!r} format")
    if header.get("version") != VERSION:
        raise DeltaError(f"{where}: delta version {header.get('version')!r}, expected {VERSION}")
    if header.get("kind") not in KINDS:
        raise DeltaError(f"{where}: kind {header.get('kind')!r}, expected one of {KINDS}")
    for field, low in (("server", 0), ("seq", 0), ("step", 0), ("payload_bytes", 0)):
        _integer(header.get(field), field, where, low)
    if not isinstance(header.get("created"), (int, float)) or isinstance(header.get("created"), bool):
        raise DeltaError(f"{where}: created must be a number")
    if header["payload_bytes"] != payload_bytes:
        raise DeltaError(f"{where}: header says {header['payload_bytes']} payload bytes, the file has "
                         f"{payload_bytes} (truncated or appended to)")
    if not isinstance(header.get("payload_sha256"), str):
        raise DeltaError(f"{where}: payload_sha256 missing")
    tables, dense, arrays = header.get("tables"), header.get("dense"), header.get("arrays")
    if not isinstance(tables, dict) or not isinstance(dense, dict) or not isinstance(arrays, list):
        raise DeltaError(f"{where}: tables, dense and arrays must be an object, an object and a list")
    for name, info in tables.items():
        if not isinstance(info, dict) or info.get("dtype") not in VALUE_DTYPES:
            raise DeltaError(f"{where}: table {name!r} entry {info!r} is malformed")
        for field, low in (("dim", 1), ("rows", 0), ("tombstones", 0), ("version", 0)):
            _integer(info.get(field), f"table {name!r} {field}", where, low)
    for name, info in dense.items():
        if not isinstance(info, dict):
            raise DeltaError(f"{where}: dense block {name!r} entry is malformed")
        _integer(info.get("elements"), f"dense block {name!r} elements", where, 0)
    seen = set()
    for entry in arrays:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or entry["name"] in seen:
            raise DeltaError(f"{where}: array entry {entry!r} is malformed or repeated")
        seen.add(entry["name"])
        if entry.get("dtype") not in ARRAY_DTYPES:
            raise DeltaError(f"{where}: array {entry['name']} has dtype {entry.get('dtype')!r}, expected one of "
                             f"{ARRAY_DTYPES}")
        shape = entry.get("shape")
        if not isinstance(shape, list) or not 1 <= len(shape) <= 2:
            raise DeltaError(f"{where}: array {entry['name']} shape {shape!r} must be 1 or 2 integers")
        for n in shape:
            _integer(n, f"array {entry['name']} shape", where)
        _integer(entry.get("offset"), f"array {entry['name']} offset", where)
        end = entry["offset"] + math.prod(shape) * np.dtype(entry["dtype"]).itemsize
        if end > payload_bytes:
            raise DeltaError(f"{where}: array {entry['name']} ends at byte {end}, past the payload's {payload_bytes}")
