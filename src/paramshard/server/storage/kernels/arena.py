"""Row arrays in anonymous mappings sized to what a table holds, grown without copying rows.

A store's per-row arrays (the ids, values, optimizer state, update counts, last-seen
versions, admission counters) each live in one anonymous private mapping with
MAP_NORESERVE: the kernel commits a page only when a row on it is first written.
A mapping holds the rows the table has, with room to double (``grow``), in whole huge
pages (2 MiB, see ``_pages``): its address space is in proportion to the table, at most
about twice its bytes, at least 2 MiB an array. (It used to be
reserved for the whole row limit up front, PARAMSHARD_MAX_ROWS: 42 GB of address space
for a dim-4 table, 545 GB for dim 64. Under an address-space limit, ``ulimit -v``, a
server then died at its next thread stack (a libzmq abort); under vm.overcommit_memory=2
the reservation counted against the commit limit; a few hundred wide tables would not
fit in the 128 TiB of a process.)

Growing never copies rows, and rows never move for a reader that holds an array:

* First ``mremap`` grows the mapping where it is, when the addresses after it are free:
  every array over it stays valid.
* Otherwise the rows' pages move, by ``mremap(MREMAP_MAYMOVE | MREMAP_FIXED |
  MREMAP_DONTUNMAP)``, to a new mapping twice as large (aligned to huge pages, so they
  stay huge): the kernel moves page tables, not bytes (constant time per 2 MiB), and
  leaves the old range mapped, empty. The store then swaps its arrays for ones over
  the new mapping, all on the server's single thread between requests.
  Why not plain ``MREMAP_MAYMOVE``: the old range would be unmapped while a numpy array
  over it might still be held; the store's own readers (the kernels, ``gather``, pages,
  snapshots, migration) take the arrays afresh on every call and copy what they return,
  so none is, but the ``SparseTable.values`` of tests and benchmarks is the array itself,
  and a stale pointer would be a segfault, not an error. With DONTUNMAP an array held
  across a growth reads zeros instead (the numpy store's arrays go stale the same way:
  it grows by copying), and the old range is unmapped when the last array over it goes
  (every numpy view's base chain ends at the one ctypes buffer of its mapping, which
  owns it). Chunked arenas were the other way to keep rows in place, but every compiled
  kernel takes one array per part and indexes it by row; a chunk table would cost an
  extra indirection on every row access. memfd mappings (grow by mapping the same
  file larger) keep old arrays coherent, but shared memory gets no huge pages
  (shmem_enabled is 'never' by default) and random row access over gigabytes spends
  2.5x more time in TLB misses without them.
* Where DONTUNMAP is not supported (Linux < 5.7), the rows are copied into the new
  mapping.

Every mapping first checks the process's address-space limit (RLIMIT_AS, read with
``resource.getrlimit``): one that would bring the process's mapped size (VmSize) within
HEADROOM of the limit is refused with ``OutOfAddressSpace`` (a ConfigError and a
MemoryError) naming what it was for, the rows, the bytes and the limit; the store
checks before it changes anything, so the request is refused whole, sent back as an
error reply, and the server goes on. HEADROOM is left for what the process maps
later on its own (thread stacks, malloc arenas, message buffers): without it a table
could fill the limit and the next thread would abort the process.

``reserve_file`` is a reservation over a sparse file, shared, for the whole row limit:
the disk tier's (server/storage/tiered_row_store.py), whose pages ``drop`` takes out of the
process without losing them. (It keeps its file mappings at fixed addresses, so it
is not grown; a tiered table costs its row limit in address space.)
"""
from __future__ import annotations

import ctypes
import errno
import mmap
import os
import resource

import numpy as np

from paramshard.errors import OutOfAddressSpace

MAP_NORESERVE = 0x4000      # Linux's values; Python's mmap module does not name them
MAP_FIXED = 0x10
MREMAP_MAYMOVE, MREMAP_FIXED, MREMAP_DONTUNMAP = 1, 2, 4
PAGE = mmap.PAGESIZE
HUGE = 2 << 20              # a huge page: large mappings start on one, so their pages can be huge
HEADROOM = 256 << 20        # of an address-space limit, never taken by rows (see the docstring)
_PROT_RW = mmap.PROT_READ | mmap.PROT_WRITE
_ANON = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE
_FAILED = ctypes.c_void_p(-1).value
_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_libc.mremap.restype = ctypes.c_void_p
_libc.mremap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.madvise.restype = ctypes.c_int
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_dontunmap = [True]          # cleared the first time the kernel refuses MREMAP_DONTUNMAP


# -- the address-space limit --------------------------------------------------------------------
def address_space_limit() -> int | None:
    """The soft RLIMIT_AS in bytes, None when there is none."""
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def mapped_bytes() -> int:
    """The process's address space in use (VmSize), what RLIMIT_AS is compared with."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[0]) * PAGE


def check_room(nbytes: int, what: str, rows: int, unit: str = "rows") -> None:
    """Refuse (OutOfAddressSpace) ``nbytes`` more of address space for ``rows`` rows (``unit``) of
    ``what`` when they would pass the limit less HEADROOM."""
    limit = address_space_limit()
    if limit is None:
        return
    used = mapped_bytes()
    if used + nbytes > limit - HEADROOM:
        raise OutOfAddressSpace(what, rows, nbytes, limit, used, HEADROOM, unit=unit)


def _refused(what: str, rows: int, nbytes: int, err: int, unit: str = "rows") -> OutOfAddressSpace:
    limit = address_space_limit()
    return OutOfAddressSpace(what, rows, nbytes, limit, mapped_bytes(), HEADROOM, os.strerror(err), unit)


# -- mappings -------------------------------------------------------------------------------------
class _Region:
    """One anonymous mapping, unmapped when the last array over it goes (it is referenced only
    by the ctypes buffers the arrays are made over)."""
    __slots__ = ("address", "length")

    def __init__(self, address: int, length: int):
        self.address, self.length = address, length

    def __del__(self):
        if self.length:
            _libc.munmap(self.address, self.length)
            self.length = 0


def _pages(nbytes: int) -> int:
    """A mapping's length for ``nbytes``: whole huge pages (2 MiB). Faults in a huge-page-advised
    mapping then take a whole huge page each, as they did in the one large reservation of every
    row (a table's arrays cost at least one huge page each, in address space and, once written,
    in memory, as they did then); and a mapping grown by a move ends on a huge-page boundary
    where the fresh part starts, so the fresh part's huge pages are whole. (Mappings in 4 KiB
    pages, a fault each, took 1.3-1.6x as long to fill a table from 1,024 rows to 100,000.)"""
    return max(HUGE, -(-nbytes // HUGE) * HUGE)


def _map(length: int, what: str, rows: int, unit: str = "rows") -> int:
    """A fresh RW mapping of ``length`` bytes (whole pages), on a huge-page boundary when it is
    that large (so its pages can be huge: the kernel only makes huge pages of aligned 2 MiB)."""
    align = HUGE
    span = length + align - PAGE
    address = _libc.mmap(None, span, _PROT_RW, _ANON, -1, 0)
    if address in (None, _FAILED):
        raise _refused(what, rows, length, ctypes.get_errno(), unit)
    start = -(-address // align) * align
    if start > address:
        _libc.munmap(address, start - address)
    if address + span > start + length:
        _libc.munmap(start + length, address + span - start - length)
    if _MADV_HUGEPAGE is not None:
        # Huge pages, as numpy asks for its own large arrays: random row access over
        # gigabytes otherwise spends more time in TLB misses than in reading (measured 2.5x).
        _libc.madvise(start, length, _MADV_HUGEPAGE)
    return start


def _array(region: _Region, rows: int, row_shape: tuple, dtype: np.dtype) -> np.ndarray:
    buffer = (ctypes.c_byte * region.length).from_address(region.address)
    # The arrays keep the buffer, the buffer keeps the mapping (_holder finds it). A ctypes
    # instance takes any attribute; its class declares none, so the checker cannot know this one.
    buffer.region = region         # type: ignore[attr-defined]
    count = rows * int(np.prod(row_shape, dtype=np.int64))
    # Through a memoryview: numpy's stubs take bytes-like types, not every buffer (the chain
    # _holder walks is one link longer: array, memoryview, buffer).
    return np.frombuffer(memoryview(buffer), dtype, count=count).reshape((rows,) + tuple(row_shape))


def _row_bytes(row_shape: tuple, dtype) -> int:
    return int(np.prod(row_shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def reserve(rows: int, row_shape: tuple[int, ...], dtype, minimum: int = 16, what: str = "a row store",
            unit: str = "rows") -> np.ndarray:
    """A zero-filled array of ``max(rows, minimum)`` rows, backed by pages committed on first
    write; OutOfAddressSpace (counting ``unit``) when it does not fit the address-space limit."""
    dtype = np.dtype(dtype)
    rows = max(rows, minimum)
    length = _pages(rows * _row_bytes(row_shape, dtype))
    check_room(length, what, rows, unit)
    return _array(_Region(_map(length, what, rows, unit), length), rows, tuple(row_shape), dtype)


def _holder(array: np.ndarray) -> mmap.mmap | ctypes.Array | None:
    """The object at the end of an array's base chain: a mapping's ctypes buffer, an mmap, or None."""
    obj: object = array
    for _ in range(4):
        obj = getattr(obj, "base", None) if not isinstance(obj, memoryview) else obj.obj
        if obj is None or isinstance(obj, mmap.mmap):
            return obj
        if isinstance(obj, ctypes.Array) and hasattr(obj, "region"):     # one _array made
            return obj
    return None


def room_needed(array: np.ndarray, rows: int) -> int:
    """Address space ``grow(array, rows)`` may take at most while it runs (a move keeps the old
    mapping until its arrays go: the new one, with its alignment slack)."""
    if rows <= len(array):
        return 0
    return _pages(rows * array.strides[0]) + HUGE


def grow(array: np.ndarray, rows: int, used: int, what: str = "a row store") -> np.ndarray:
    """An array of ``rows`` rows (more than ``len(array)``) whose first ``len(array)`` rows are
    ``array``'s: over the same mapping grown in place, or over a new one its pages moved to
    (see the docstring); rows past ``used`` may read as anything written there before."""
    if rows <= len(array):
        return array
    row_shape, dtype = array.shape[1:], array.dtype
    holder = _holder(array)
    region = getattr(holder, "region", None)
    length = _pages(rows * array.strides[0])
    if region is None or array.ctypes.data != region.address:
        # Not a mapping of ours (a plain array, or a view into one): a copy, as the numpy store grows.
        bigger = reserve(rows, row_shape, dtype, minimum=rows, what=what)
        bigger[:used] = array[:used]
        return bigger
    old = region.length
    check_room(length - old, what, rows)
    if _libc.mremap(region.address, old, length, 0, None) not in (None, _FAILED):
        region.length = length            # grown where it is: every array over it stays valid
        if _MADV_HUGEPAGE is not None:
            _libc.madvise(region.address, length, _MADV_HUGEPAGE)
        return _array(region, rows, row_shape, dtype)
    check_room(length + HUGE, what, rows)
    target = _map(length, what, rows)
    if _dontunmap[0]:
        moved = _libc.mremap(region.address, old, old, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, target)
        if moved not in (None, _FAILED):
            return _array(_Region(target, length), rows, row_shape, dtype)
        err = ctypes.get_errno()
        if err != errno.EINVAL:
            _libc.munmap(target, length)
            raise _refused(what, rows, length, err)
        _dontunmap[0] = False          # an older kernel: copy from now on
    fresh = _Region(target, length)
    bigger = _array(fresh, rows, row_shape, dtype)
    bigger[:used] = array[:used]
    return bigger


def zeros(count: int, dtype, what: str = "an id index") -> np.ndarray:
    """np.zeros(count, dtype) on huge pages: a large array written at random (a hash index's
    buckets) otherwise takes a page fault per 4 KiB (measured: 0.9 s of a 1M-row first touch
    into 256 MB of fresh buckets)."""
    if count * np.dtype(dtype).itemsize < (4 << 20):
        return np.zeros(count, dtype)
    return reserve(count, (), dtype, minimum=count, what=what, unit="buckets")


# -- pages given back -------------------------------------------------------------------------------
def _span(array: np.ndarray) -> tuple[int, int, object] | None:
    """(address, length, holder) of the mapping behind a reserved array, None for a plain one."""
    holder = _holder(array)
    if isinstance(holder, mmap.mmap):
        return _address(holder), len(holder), holder
    if holder is None:
        return None
    return ctypes.addressof(holder), ctypes.sizeof(holder), holder


def _address(area: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(area))


def _byte_range(array: np.ndarray, span, start_row: int, end_row: int) -> tuple[int, int]:
    """Offsets in the mapping of rows start_row..end_row-1 of ``array`` (a view of it, maybe not at its start)."""
    base = array.ctypes.data - span[0]
    return base + start_row * array.strides[0], min(span[1], base + end_row * array.strides[0])


def _madvise(span, start: int, length: int, advice: int) -> None:
    if isinstance(span[2], mmap.mmap):
        span[2].madvise(advice, start, length)
    elif _libc.madvise(span[0] + start, length, advice) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"madvise: {os.strerror(err)}")


def drop(array: np.ndarray, start_row: int, end_row: int) -> None:
    """Unmap the whole pages within rows start_row..end_row-1 from the process (a page that
    also holds rows outside them stays). In a file-backed array (``reserve_file``) they stay
    in the page cache or the file and come back unchanged on the next access; in an anonymous
    one they are lost."""
    span = _span(array)
    if span is None:
        return
    start, end = _byte_range(array, span, start_row, end_row)
    start, end = -(-start // PAGE) * PAGE, end // PAGE * PAGE
    if end > start:
        _madvise(span, start, end - start, mmap.MADV_DONTNEED)


def release(array: np.ndarray, start_row: int) -> None:
    """Give the pages past row ``start_row`` back to the system (after rows were compacted
    or dropped); they read as zeros again."""
    span = _span(array)
    if span is None:
        return
    start = -(-_byte_range(array, span, start_row, start_row)[0] // PAGE) * PAGE
    if start < span[1]:
        if isinstance(span[2], mmap.mmap) and hasattr(mmap, "MADV_REMOVE"):
            try:        # a file-backed array (reserve_file): punch the pages out of the file too
                span[2].madvise(mmap.MADV_REMOVE, start, span[1] - start)
                return
            except OSError:
                pass
        _madvise(span, start, span[1] - start, mmap.MADV_DONTNEED)


# -- the disk tier's files ------------------------------------------------------------------------------
FILE_ALIGN = 64 << 10      # the kernel's fault-around window (fault_around_bytes): see reserve_file


def reserve_file(path, rows: int, row_shape: tuple[int, ...], dtype, minimum: int = 16) -> np.ndarray:
    """``reserve`` backed by the file ``path`` (made, or emptied, with mode 0600): a sparse file of
    the whole reservation mapped MAP_SHARED, so it takes disk only where rows are written. A
    page dropped from the mapping (``drop``) stays in the page cache or the file and reads
    back exactly on the next access: the disk tier of server/storage/tiered_row_store.py. The file is
    scratch; whoever made it removes it.

    A read fault on a file mapping maps the pages around it that are in the page cache too
    (fault-around: a FILE_ALIGN window aligned in the address space; whole large folios where
    readahead made them). So that a fault never maps pages of rows far from the one read,
    the mapping is MADV_RANDOM (no readahead: single-page folios; measured 60 pages mapped
    per read fault without it, 16 with) and row 0 starts on a FILE_ALIGN boundary of the
    address space: a window then never straddles two FILE_ALIGN-sized groups of rows."""
    dtype = np.dtype(dtype)
    row_bytes = _row_bytes(row_shape, dtype)
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
    span = _span(array)
    if span is None:
        raise ValueError("file_offset: not an array of reserve_file")
    return array.ctypes.data - span[0]
