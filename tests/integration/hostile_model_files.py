"""Model files as torch.save writes them, but written here member by member, so a test can
make any size in them lie: the pickle's shapes, the zip's central directory, a DEFLATE
member's stream. The bomb is built from one compressed MiB of zeros repeated (independent
DEFLATE blocks after a full flush), so making it costs no 2 GiB."""
import collections
import pickle
import struct
import zlib

import torch


class StorageRef:
    def __init__(self, key: str, kind, numel: int):
        self.key, self.kind, self.numel = key, kind, numel


class TensorRef:
    """Pickles as torch.save pickles a tensor: _rebuild_tensor_v2 over a persistent storage."""

    def __init__(self, storage: StorageRef, shape):
        self.storage, self.shape = storage, tuple(shape)

    def __reduce__(self):
        stride, step = [], 1
        for n in reversed(self.shape):
            stride.insert(0, step)
            step *= max(n, 1)
        return (torch._utils._rebuild_tensor_v2,
                (self.storage, 0, self.shape, tuple(stride), False, collections.OrderedDict()))


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, StorageRef):
            return ("storage", obj.kind, obj.key, "cpu", obj.numel)
        return None


KINDS = {torch.float32: torch.FloatStorage, torch.int64: torch.LongStorage}


def take_apart(model: dict):
    """``model`` with every tensor replaced by a TensorRef; {key: the tensor's bytes}; {field path: TensorRef}."""
    data, refs = {}, {}

    def walk(value, where):
        if isinstance(value, torch.Tensor):
            key = str(len(data))
            t = value.detach().contiguous()
            data[key] = t.numpy().tobytes()
            refs[where] = ref = TensorRef(StorageRef(key, KINDS[t.dtype], t.numel()), t.shape)
            return ref
        if isinstance(value, dict):
            return {k: walk(v, f"{where}/{k}") for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, f"{where}/{i}") for i, v in enumerate(value)]
        return value
    return walk(model, ""), data, refs


class Member:
    """One zip member: its bytes on disk and what the headers say about them."""

    def __init__(self, name: str, raw: bytes, size: int, crc: int, method: int = 0):
        self.name, self.raw, self.size, self.crc, self.method = name, raw, size, crc, method


def stored(name: str, data: bytes) -> Member:
    return Member(name, data, len(data), zlib.crc32(data))


def deflated_zeros(name: str, total: int, stated: int | None = None, prefix: bytes = b"") -> Member:
    """``prefix`` then ``total`` zero bytes DEFLATE-compressed (~1/1000 of it), stating ``stated``
    (default: the true size)."""
    chunk = 1 << 20
    assert total % chunk == 0
    head = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = head.compress(prefix) + head.flush(zlib.Z_FULL_FLUSH) if prefix else b""
    segment = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = segment.compress(bytes(chunk)) + segment.flush(zlib.Z_FULL_FLUSH)
    raw = first + block * (total // chunk) + b"\x03\x00"      # + an empty final block
    size = len(prefix) + total
    # The CRC of what the headers state: a lying size passes a reader that trusts it (zipfile's).
    crc, zeros, left = zlib.crc32(prefix), bytes(chunk), (size if stated is None else stated) - len(prefix)
    while left > 0:
        crc = zlib.crc32(zeros[:min(chunk, left)], crc)
        left -= chunk
    return Member(name, raw, size if stated is None else stated, crc, zlib.DEFLATED)


def npy_header(dtype, shape) -> bytes:
    """The header numpy writes before an array's bytes in a .npy file."""
    import io
    import numpy as np
    from numpy.lib import format as npy
    out = io.BytesIO()
    npy.write_array_header_1_0(out, {"descr": npy.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
                                     "shape": tuple(shape)})
    return out.getvalue()


def write_zip(path, members) -> None:
    """A zip archive (32-bit sizes: each below 4 GiB) with exactly the headers the members state."""
    central, offset = [], 0
    with open(path, "wb") as f:
        for m in members:
            name = m.name.encode()
            f.write(struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, m.method, 0, 0, m.crc, len(m.raw), m.size,
                                len(name), 0) + name)
            f.write(m.raw)
            central.append(struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, m.method, 0, 0, m.crc,
                                       len(m.raw), m.size, len(name), 0, 0, 0, 0, 0, offset) + name)
            offset += 30 + len(name) + len(m.raw)
        directory = b"".join(central)
        f.write(directory)
        f.write(struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(members), len(members), len(directory), offset, 0))


def write_model(path, structure, data: dict, replace: dict | None = None) -> None:
    """The archive torch.save would write for ``structure`` (TensorRefs) and ``data``; ``replace``:
    member name (under model/) -> a Member to write instead."""
    members = [stored("model/data.pkl", _pickle(structure)), stored("model/byteorder", b"little")]
    members += [stored(f"model/data/{key}", raw) for key, raw in data.items()]
    members.append(stored("model/version", b"3\n"))
    replace = replace or {}
    write_zip(path, [replace.get(m.name, m) for m in members])


def _pickle(structure) -> bytes:
    import io
    out = io.BytesIO()
    _Pickler(out, protocol=2).dump(structure)
    return out.getvalue()
