"""A model file's sizes, checked before torch reads it: a file someone sent decides nothing
about how much this process allocates.

A model file is ``torch.save``'s zip archive: a pickle (``data.pkl``) naming every tensor's
storage, dtype and shape, and one member per storage (``data/<key>``). torch.load believes
all of it: a tensor whose recorded shape is [10**12, 8] is allocated before its data is
found missing, and a DEFLATE member inflates to whatever size its header states (a 2 MB
member of zeros becomes 2 GiB). So, before torch.load:

- the central directory: every member lies inside the file; a stored member (torch.save
  writes nothing else) holds exactly its size; a compressed one may state at most
  ``MAX_EXPANSION`` times its compressed size (plus ``SLACK_BYTES``), the hard limit;
- the pickle (at most ``MAX_PICKLE_BYTES``) is read with a parser that builds nothing: every
  name it mentions becomes an inert stand-in (``_Inert``), so only the sizes come out: each
  tensor's field in the file, dtype, shape and storage;
- each tensor must fit its storage, and each storage's member must hold exactly the bytes
  the pickle says: that is the cap a member is held to;
- every compressed member is inflated once, by a bounded reader that stops the moment it
  passes the member's cap, whatever its header claims, without keeping what it read.

A table export (.npz, export.load_table) gets the same central-directory and bounded-reader
checks, with each .npy member's own header (dtype and shape) as its cap (``check_npz``).

What passes cannot make torch.load allocate more than the file holds (times
``MAX_EXPANSION`` for a compressed member). Errors are ModelArchiveError naming the file
and the field or member; the caller (serving.read_model) adds what to do.
"""
from __future__ import annotations

import os
import pickle
import struct
import zipfile
import zlib
from pathlib import Path

MAX_PICKLE_BYTES = 64 << 20      # the pickle holds names, numbers and the spec: far below this
MAX_RECORD_BYTES = 1 << 20       # version, byteorder, ...: a few bytes each
MAX_EXPANSION = 64               # a compressed member inflates to at most this x its compressed size
SLACK_BYTES = 1 << 20            # ... plus this (tiny members compress badly)
_CHUNK = 1 << 20                 # the bounded reader's step: what it holds at once
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")     # a zip local file header (30 bytes)
# Bytes per element of the storages torch.save names (torch/storage.py's legacy classes).
_ITEM_BYTES = {"DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2,
               "LongStorage": 8, "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1,
               "BoolStorage": 1, "UntypedStorage": 1, "ComplexFloatStorage": 8, "ComplexDoubleStorage": 16}


class ModelArchiveError(ValueError):
    """A size in the file that does not hold; worded to follow "FILE: "."""


class NotAnArchive(ModelArchiveError):
    """Not a zip archive at all (a text file, an older torch format): no size was at stake."""


class _Inert:
    """Whatever the pickle names (a class, a function) while its sizes are read: called, it
    makes another inert object; filled (dict items, list items, state), it keeps nothing."""

    def __init__(self, *args, **kwargs):
        pass

    def __setitem__(self, key, value):
        pass

    def __setstate__(self, state):
        pass

    def append(self, value):
        pass

    def extend(self, values):
        pass


class _Storage:
    __slots__ = ("kind", "key", "nbytes")

    def __init__(self, kind: str, key: str, nbytes: int):
        self.kind, self.key, self.nbytes = kind, key, nbytes


class _StorageKind:
    def __init__(self, name: str):
        self.name = name


class _Tensor:
    """A tensor as the pickle describes it: its storage, offset, shape and strides."""
    __slots__ = ("storage", "offset", "shape", "stride")

    def __init__(self, storage, offset, shape, stride, *rest):
        self.storage, self.offset, self.shape, self.stride = storage, offset, shape, stride


class _SizeReader(pickle.Unpickler):
    def __init__(self, data: bytes):
        import io
        super().__init__(io.BytesIO(data))
        self.storages: dict[str, _Storage] = {}

    def find_class(self, module: str, name: str):
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _Tensor
        if module == "torch" and name.endswith("Storage"):
            return _StorageKind(name)
        return _Inert       # nothing the pickle names is imported, let alone run

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] in ("storage", b"storage")):
            raise ModelArchiveError(f"a persistent id {str(pid)[:80]} that is not a tensor storage")
        _, kind, key, _location, numel = pid
        name = kind.name if isinstance(kind, _StorageKind) else "?"
        if name not in _ITEM_BYTES or not isinstance(key, str) or type(numel) is not int or numel < 0:
            raise ModelArchiveError(f"storage {str(key)[:40]!r}: {name} of {str(numel)[:40]} elements is not "
                                    f"a tensor storage this reader knows")
        storage = _Storage(name, key, numel * _ITEM_BYTES[name])
        self.storages.setdefault(key, storage)
        return self.storages[key]


def _fields(value, where: str = ""):
    """(field, _Tensor) for every tensor in the structure the size reader built."""
    if isinstance(value, _Tensor):
        yield where or "the file", value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _fields(item, f"{where}[{str(key)[:60]!r}]")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _fields(item, f"{where}[{i}]")


def _tensor_bytes(field: str, t: _Tensor) -> int:
    """Bytes of its storage the tensor reaches; ModelArchiveError for a shape that is not one."""
    shape, stride, offset = t.shape, t.stride, t.offset
    if (not isinstance(shape, tuple) or not isinstance(stride, tuple) or len(shape) != len(stride)
            or not all(type(v) is int and v >= 0 for v in (*shape, *stride, offset))
            or not isinstance(t.storage, _Storage)):
        raise ModelArchiveError(f"{field}: shape {str(shape)[:80]}, strides {str(stride)[:80]} are not a "
                                f"tensor's")
    item = _ITEM_BYTES[t.storage.kind]
    if 0 in shape:
        return 0
    last = offset + sum((n - 1) * s for n, s in zip(shape, stride))
    return (last + 1) * item


def _describe(n: int) -> str:
    return f"{n:,} bytes" if n < 1 << 30 else f"{n:,} bytes ({n / (1 << 30):.3g} GiB)"


class _Members:
    """The archive's central directory, checked against the file's own size."""

    def __init__(self, path: Path, zf: zipfile.ZipFile, torch_save: bool = True):
        """``torch_save``: torch.save's layout (a pickle and its storages), else numpy's .npz
        (one .npy member per array)."""
        self.path, self.zf = path, zf
        self.file_bytes = os.path.getsize(path)
        self.by_name = {info.filename: info for info in zf.infolist()}
        self.pickle = self.prefix = None
        if torch_save:
            pickles = [n for n in self.by_name if n.endswith("/data.pkl") or n == "data.pkl"]
            if len(pickles) != 1:
                raise ModelArchiveError(f"{len(pickles)} data.pkl members (torch.save writes one)")
            self.pickle = pickles[0]
            self.prefix = self.pickle[:-len("data.pkl")]
        for info in zf.infolist():
            self._check(info)

    def holds_data(self, name: str) -> bool:
        """A member of array data, held to the size its description states (not a fixed cap)."""
        return name.startswith(self.prefix + "data/") if self.prefix is not None else name.endswith(".npy")

    def _check(self, info: zipfile.ZipInfo) -> None:
        name = info.filename
        if info.header_offset + info.compress_size > self.file_bytes:
            raise ModelArchiveError(f"member {name} says it holds {_describe(info.compress_size)} at byte "
                                    f"{info.header_offset}, past the end of the file ({_describe(self.file_bytes)})")
        if info.compress_type == zipfile.ZIP_STORED:
            if info.file_size != info.compress_size:
                raise ModelArchiveError(f"member {name} is stored uncompressed but states {info.file_size} bytes "
                                        f"for {info.compress_size} on disk")
        elif info.compress_type != zipfile.ZIP_DEFLATED:
            raise ModelArchiveError(f"member {name} uses compression method {info.compress_type} (torch.save "
                                    f"writes members uncompressed)")
        elif info.file_size > MAX_EXPANSION * info.compress_size + SLACK_BYTES:
            raise ModelArchiveError(f"member {name} states it inflates to {_describe(info.file_size)} from "
                                    f"{_describe(info.compress_size)}, past the limit of {MAX_EXPANSION}x "
                                    f"(a compression bomb, or not a model file)")
        if name == self.pickle:
            cap, what = MAX_PICKLE_BYTES, "the pickle"
        elif self.holds_data(name):
            return          # held to what the pickle or its .npy header says (check_model_archive, check_npz)
        else:
            cap, what = MAX_RECORD_BYTES, "a record"
        if info.file_size > cap:
            raise ModelArchiveError(f"member {name} states {_describe(info.file_size)}, more than {what} of a "
                                    f"model file may hold ({_describe(cap)})")

    def read_bounded(self, info: zipfile.ZipInfo, keep: bool) -> bytes:
        """The member's bytes (``keep``: else only counted), never more than its stated size:
        a compressed stream that inflates past it is refused as soon as it does."""
        if info.compress_type == zipfile.ZIP_STORED:
            if not keep:
                return b""
            with self.zf.open(info) as f:
                return f.read(info.file_size)
        cap = info.file_size
        with open(self.path, "rb") as f:
            f.seek(info.header_offset)
            head = f.read(_LOCAL_HEADER.size)
            if len(head) != _LOCAL_HEADER.size or head[:4] != b"PK\x03\x04":
                raise ModelArchiveError(f"member {info.filename}: no local header at byte {info.header_offset}")
            fields = _LOCAL_HEADER.unpack(head)
            f.seek(info.header_offset + _LOCAL_HEADER.size + fields[-2] + fields[-1])
            inflater = zlib.decompressobj(-zlib.MAX_WBITS)
            left, pending, total, kept = info.compress_size, b"", 0, []
            while True:
                if not pending:
                    if left <= 0:
                        break
                    pending = f.read(min(_CHUNK, left))
                    left -= len(pending)
                    if not pending:
                        break
                try:
                    out = inflater.decompress(pending, _CHUNK)
                except zlib.error as exc:
                    raise ModelArchiveError(f"member {info.filename}: damaged compressed data ({exc})") from None
                pending = inflater.unconsumed_tail
                total += len(out)
                if total > cap:
                    raise ModelArchiveError(f"member {info.filename} inflates past the {_describe(cap)} it "
                                            f"states (a compression bomb with a false size); stopped there")
                if keep:
                    kept.append(out)
                if inflater.eof:
                    break
        if total != cap:
            raise ModelArchiveError(f"member {info.filename} inflates to {_describe(total)}, not the "
                                    f"{_describe(cap)} it states")
        return b"".join(kept)


def check_model_archive(path) -> None:
    """Raise ModelArchiveError unless every size in the archive at ``path`` holds (above)."""
    path = Path(path)
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise NotAnArchive(f"not a zip archive as torch.save writes ({exc})") from None
    with zf:
        members = _Members(path, zf)
        assert members.pickle is not None      # torch.save's layout: _Members found its one data.pkl or raised
        reader = _SizeReader(members.read_bounded(members.by_name[members.pickle], keep=True))
        try:
            tensors = list(_fields(reader.load()))
        except ModelArchiveError:
            raise
        except Exception as exc:      # noqa: BLE001 - any malformed pickle (or a cycle) is a damaged file
            raise ModelArchiveError(f"its pickle cannot be read ({type(exc).__name__}: {str(exc)[:200]})") from None
        for field, tensor in tensors:
            reach = _tensor_bytes(field, tensor)
            if reach > tensor.storage.nbytes:
                raise ModelArchiveError(f"{field}: shape {list(tensor.shape)} needs {_describe(reach)} of its "
                                        f"storage, which holds {_describe(tensor.storage.nbytes)}")
        for key, storage in reader.storages.items():
            name = f"{members.prefix}data/{key}"
            info = members.by_name.get(name)
            if info is None:
                raise ModelArchiveError(f"the tensor data {name} is missing")
            if info.file_size != storage.nbytes:
                users = [f for f, t in tensors if t.storage is storage]
                raise ModelArchiveError(f"{', '.join(users[:3]) or name}: the file's index says "
                                        f"{_describe(storage.nbytes)} of {storage.kind} ({name}), but that member "
                                        f"holds {_describe(info.file_size)}")
        for info in zf.infolist():
            if info.compress_type != zipfile.ZIP_STORED:
                members.read_bounded(info, keep=False)


def check_npz(path) -> None:
    """Raise ModelArchiveError unless every size in the .npz at ``path`` holds: the central
    directory as for a model file, and each .npy member's header (dtype and shape, read from
    its first bytes) states exactly the bytes the member holds; no object arrays."""
    import numpy as np
    from numpy.lib import format as npy

    path = Path(path)
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise NotAnArchive(f"not a zip archive as numpy.savez writes ({exc})") from None
    with zf:
        members = _Members(path, zf, torch_save=False)
        for info in zf.infolist():
            if not members.holds_data(info.filename):
                continue
            try:
                with zf.open(info) as f:        # inflates only what is read: the header's few bytes
                    major, _ = npy.read_magic(f)
                    if major == 1:
                        shape, _, dtype = npy.read_array_header_1_0(f, max_header_size=MAX_RECORD_BYTES)
                    else:
                        shape, _, dtype = npy.read_array_header_2_0(f, max_header_size=MAX_RECORD_BYTES)
                    header = f.tell()
            except Exception as exc:     # noqa: BLE001 - any malformed header is a damaged file
                raise ModelArchiveError(f"member {info.filename}: not a .npy array ({str(exc)[:200]})") from None
            if dtype.hasobject:
                raise ModelArchiveError(f"member {info.filename}: an array of Python objects ({dtype})")
            need = header + int(np.prod(shape, dtype=object)) * dtype.itemsize
            if need != info.file_size:
                raise ModelArchiveError(f"{info.filename[:-len('.npy')]!r}: its header says {dtype} {list(shape)} "
                                        f"({_describe(need)} with the header), but that member holds "
                                        f"{_describe(info.file_size)}")
        for info in zf.infolist():
            if info.compress_type != zipfile.ZIP_STORED:
                members.read_bounded(info, keep=False)
