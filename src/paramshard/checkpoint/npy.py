"""One .npy file of a checkpoint, read only after its header agrees with the manifest
and with the file's real size.

``numpy.load`` allocates what the header declares before reading the data: a
header declaring 2**40 floats makes it try 4 TiB. Here the header is parsed
from the file's first bytes (at most HEADER_LIMIT of them, whatever length the
header claims), compared with the manifest entry (dtype, shape, C order), and
header + data must be exactly the file's size: the array allocated is never
larger than the file. The data is then read from the same open file (no second
open a swapped file could slip through). Never a pickle: only the dtypes a
checkpoint holds (manifest.DTYPES) are accepted.
"""
from __future__ import annotations

import io
import math
import os
import zlib
from pathlib import Path

import numpy as np
from numpy.lib import format as npformat

from paramshard.checkpoint.errors import CheckpointError
from paramshard.checkpoint.jsonfile import first_line
from paramshard.checkpoint.manifest import DTYPES
from paramshard.checkpoint.paths import open_regular

HEADER_LIMIT = 1 << 16          # numpy writes headers of a few hundred bytes (it refuses > 10000 itself)
_CHUNK = 64 << 20


def _header(head: bytes, path: Path) -> tuple[tuple, bool, np.dtype, int]:
    """(shape, fortran_order, dtype, data offset) of a .npy file starting with ``head``."""
    f = io.BytesIO(head)
    try:
        version = npformat.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = npformat.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = npformat.read_array_header_2_0(f)
        else:
            raise ValueError(f"npy format version {version}, a checkpoint holds 1.0 or 2.0")
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError) as exc:
        raise CheckpointError(f"{path}: not a readable .npy header ({first_line(exc)})") from None
    return shape, fortran, dtype, f.tell()


def load_npy(path: Path, meta: dict, opened: Path | None = None) -> np.ndarray:
    """The array of ``path`` (``opened``: the confined path to open, when it differs from
    the name shown), checked against its manifest entry ``meta`` (already schema-checked:
    bytes, crc32, dtype, shape) in this order: size, CRC-32, header, then read."""
    try:
        with open_regular(opened or path, "array file") as f:
            size = os.fstat(f.fileno()).st_size
            if size != meta["bytes"]:
                raise CheckpointError(f"{path}: {size} bytes, the manifest says {meta['bytes']} (truncated?)")
            crc = 0
            while chunk := f.read(_CHUNK):
                crc = zlib.crc32(chunk, crc)
            if crc != meta["crc32"]:
                raise CheckpointError(f"{path}: CRC-32 {crc:#010x} does not match the manifest's "
                                      f"{meta['crc32']:#010x} (corrupted)")
            f.seek(0)
            shape, fortran, dtype, offset = _header(f.read(HEADER_LIMIT), path)
            if dtype.str not in DTYPES or dtype.hasobject:
                raise CheckpointError(f"{path}: dtype {dtype.str}, not one a checkpoint holds {sorted(DTYPES)}")
            if dtype.str != meta["dtype"] or list(shape) != meta["shape"]:
                raise CheckpointError(f"{path}: {dtype}{list(shape)}, the manifest says "
                                      f"{meta['dtype']}{meta['shape']}")
            if fortran and len(shape) > 1:
                raise CheckpointError(f"{path}: Fortran order; a checkpoint holds C-order arrays")
            count = math.prod(shape)        # Python ints: a hostile shape cannot overflow
            if offset + count * dtype.itemsize != size:
                raise CheckpointError(f"{path}: the header declares {count * dtype.itemsize} bytes of data, the "
                                      f"file holds {size - offset}")
            f.seek(offset)
            array = np.fromfile(f, dtype=dtype, count=count)
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if array.size != count:         # the file shrank while being read
        raise CheckpointError(f"{path}: {array.size} of {count} values readable (truncated while reading?)")
    return array.reshape(shape)
