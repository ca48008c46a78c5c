"""Row arrays reserved as address space: a table grows without ever copying its rows.

A store reserves room for its whole row limit (PARAMSHARD_MAX_ROWS) at once, as
an anonymous private mapping with MAP_NORESERVE: the kernel commits a page
only when a row on it is first written, so the reservation costs address space
(of which a 64-bit process has 128 TiB), not memory, and the growth copy that
stalled the numpy store (a 20M-row table copying 1.6 GB) never happens.

Where the reservation is refused (a ulimit -v, overcommit_memory=2), the
largest power-of-two share of it that maps is taken; past that the store
grows by copying, like the numpy store.

``reserve_file`` is the same reservation over a sparse file, shared: the disk
tier's (server/tiered_row_store.py), whose pages ``drop`` takes out of the
process without losing them.
"""
from __future__ import annotations

import ctypes
import mmap
import os

import numpy as np

MAP_NORESERVE = 0x4000      # Linux's value; Python's mmap module does not name it
PAGE = mmap.PAGESIZE


def reserve(rows: int, row_shape: tuple[int, ...], dtype, minimum: int = 16) -> np.ndarray:
    """A zero-filled array of ``rows`` rows (fewer if the address space is refused, never
    fewer than ``minimum``), backed by pages committed on first write."""
    dtype = np.dtype(dtype)
    row_bytes = int(np.prod(row_shape, dtype=np.int64)) * dtype.itemsize
    want = max(rows, minimum)
    while True:
        try:
            area = mmap.mmap(-1, max(want * row_bytes, PAGE),
                             flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE)
            break
        except (OSError, OverflowError, ValueError):
            if want <= minimum:
                return np.zeros((minimum,) + row_shape, dtype)
            want = max(minimum, want // 2)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        # Huge pages, as numpy asks for its own large arrays: random row access over
        # gigabytes otherwise spends more time in TLB misses than in reading (measured 2.5x).
        area.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(area, dtype, count=want * int(np.prod(row_shape, dtype=np.int64))).reshape(
        (want,) + row_shape)


FILE_ALIGN = 64 << 10      # the kernel's fault-around window (fault_around_bytes): see reserve_file


def reserve_file(path, rows: int, row_shape: tuple[int, ...], dtype, minimum: int = 16) -> np.ndarray:
    """``reserve`` backed by the file ``path`` (made, or emptied, with mode 0600): a sparse file of
    the whole reservation mapped MAP_SHARED, so it takes disk only where rows are written. A
    page dropped from the mapping (``drop``) stays in the page cache or the file and reads
    back exactly on the next access: the disk tier of server/tiered_row_store.py. The file is
    scratch; whoever made it removes it.

    A read fault on a file mapping maps the pages around it that are in the page cache too
    (fault-around: a FILE_ALIGN window aligned in the address space; whole large folios where
    readahead made them). So that a fault never maps pages of rows far from the one read,
    the mapping is MADV_RANDOM (no readahead: single-page folios; measured 60 pages mapped
    per read fault without it, 16 with) and row 0 starts on a FILE_ALIGN boundary of the
    address space: a window then never straddles two FILE_ALIGN-sized groups of rows."""
    dtype = np.dtype(dtype)
    row_bytes = int(np.prod(row_shape, dtype=np.int64)) * dtype.itemsize
    want = max(rows, minimum)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        while True:
            size = max(want * row_bytes, PAGE) + FILE_ALIGN
            try:
                os.ftruncate(fd, size)
                area = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
                break
            except (OSError, OverflowError, ValueError):
                if want <= minimum:
                    raise
                want = max(minimum, want // 2)
    finally:
        os.close(fd)           # the mapping keeps its own reference to the file
    if hasattr(mmap, "MADV_RANDOM"):
        area.madvise(mmap.MADV_RANDOM)
    offset = -_address(area) % FILE_ALIGN
    return np.frombuffer(area, dtype, count=want * int(np.prod(row_shape, dtype=np.int64)),
                         offset=offset).reshape((want,) + row_shape)


def file_offset(array: np.ndarray) -> int:
    """Where row 0 of a ``reserve_file`` array is in its file (the mapping starts at offset 0)."""
    return array.ctypes.data - _address(_mapping_of(array))


def _address(area: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(area))


def _byte_range(array: np.ndarray, area: mmap.mmap, start_row: int, end_row: int) -> tuple[int, int]:
    """Offsets in ``area`` of rows start_row..end_row-1 of ``array`` (a view of it, maybe not at its start)."""
    base = array.ctypes.data - _address(area)
    return base + start_row * array.strides[0], min(len(area), base + end_row * array.strides[0])


def drop(array: np.ndarray, start_row: int, end_row: int) -> None:
    """Unmap the whole pages within rows start_row..end_row-1 from the process (a page that
    also holds rows outside them stays). In a file-backed array (``reserve_file``) they stay
    in the page cache or the file and come back unchanged on the next access; in an anonymous
    one they are lost."""
    area = _mapping_of(array)
    if area is None:
        return
    start, end = _byte_range(array, area, start_row, end_row)
    start, end = -(-start // PAGE) * PAGE, end // PAGE * PAGE
    if end > start:
        area.madvise(mmap.MADV_DONTNEED, start, end - start)


def zeros(count: int, dtype) -> np.ndarray:
    """np.zeros(count, dtype) on huge pages: a large array written at random (a hash index's
    buckets) otherwise takes a page fault per 4 KiB (measured: 0.9 s of a 1M-row first touch
    into 256 MB of fresh buckets)."""
    if count * np.dtype(dtype).itemsize < (4 << 20):
        return np.zeros(count, dtype)
    out = reserve(count, (), dtype, minimum=count)
    return out if len(out) == count else np.zeros(count, dtype)


def release(array: np.ndarray, start_row: int) -> None:
    """Give the pages past row ``start_row`` back to the system (after rows were compacted
    or dropped); they read as zeros again."""
    area = _mapping_of(array)
    if area is None:
        return
    start = -(-_byte_range(array, area, start_row, start_row)[0] // PAGE) * PAGE
    if start < len(area):
        if hasattr(mmap, "MADV_REMOVE"):
            try:        # a file-backed array (reserve_file): punch the pages out of the file too
                area.madvise(mmap.MADV_REMOVE, start, len(area) - start)
                return
            except OSError:          # an anonymous mapping (EINVAL): the pages are its own
                pass
        area.madvise(mmap.MADV_DONTNEED, start, len(area) - start)


def _mapping_of(array: np.ndarray) -> mmap.mmap | None:
    """The mapping behind a reserved array (ndarray -> ndarray -> memoryview -> mmap)."""
    obj = array
    for _ in range(4):
        obj = getattr(obj, "base", None) if not isinstance(obj, memoryview) else obj.obj
        if isinstance(obj, mmap.mmap) or obj is None:
            return obj
    return None


def grown(array: np.ndarray, rows_needed: int, rows_used: int) -> np.ndarray:
    """``array`` with room for ``rows_needed`` rows: itself, or (only past a refused
    reservation) a copy a quarter larger."""
    if rows_needed <= len(array):
        return array
    bigger = np.zeros((max(rows_needed, len(array) + len(array) // 4 + 1),) + array.shape[1:], array.dtype)
    bigger[:rows_used] = array[:rows_used]
    return bigger
