"""Disk space for the disk tier's files (server/storage/tiered_row_store.py), taken before rows are written.

The tier's files are sparse (kernels/arena.py ``reserve_file``): a row takes disk only when it
is first written, through a MAP_SHARED mapping. Such a write cannot fail the way write() does:
on a full file system (or a user's quota) the kernel sends SIGBUS and the server dies, its
launcher saying only "killed by SIGBUS". So before a call writes rows past the ones already
reserved, ``TierSpace.ensure`` allocates their byte range of every file with posix_fallocate
(tmpfs, ext4, xfs and btrfs allocate natively; elsewhere glibc writes a zero into each block),
which fails with ENOSPC/EDQUOT instead: ``TierFull``, naming the table, the directory, the bytes
needed and the bytes free. It is raised before any row is made, so the store is as it was; the
server answers the request with error code ``disk_full`` and goes on serving (the table keeps
its rows and refuses only new ones).

Space is taken ahead, an eighth of what is held (at least a region) at a time, so a call rarely
needs a system call; a full disk is retried with exactly what the call needs before it fails.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np

from paramshard.budgets import show_bytes
from paramshard.errors import ParamshardError
from paramshard.server.storage.kernels import arena

_FULL = (errno.ENOSPC, errno.EDQUOT)


class TierFull(ParamshardError, MemoryError):
    """A table's disk tier cannot grow: its file system is full. Error code ``disk_full``."""
    wire_code = "disk_full"


def free_bytes(directory: str | os.PathLike) -> int:
    """Bytes an unprivileged user may still write on the file system of ``directory`` (-1: unknown)."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return -1
    return st.f_bavail * st.f_frsize


class TierSpace:
    """The disk reserved for rows 0..reserved-1 of each of a store's tier files."""

    def __init__(self, arrays: list[tuple[str, np.ndarray]], directory: str | os.PathLike,
                 table: str | None = None, step_rows: int = 1):
        """``arrays``: (file name stem, array mapped from ``directory``/stem.rows) pairs."""
        self.directory = Path(directory)
        self.table = table
        self.step_rows = max(1, step_rows)
        self.files = [(str(self.directory / f"{name}.rows"), arena.file_offset(a), a.strides[0]) for name, a in arrays]
        self.capacity = min(len(a) for _, a in arrays)
        self.reserved = 0

    def bytes_for(self, start_row: int, end_row: int) -> int:
        return sum(stride for _, _, stride in self.files) * max(0, end_row - start_row)

    def ensure(self, rows: int) -> None:
        """Disk for rows 0..rows-1 of every file, or TierFull (nothing written, the store whole)."""
        if rows <= self.reserved:
            return
        rows = min(rows, self.capacity)      # past the files the store refuses on its own (MemoryError)
        exact = min(self.capacity, -(-rows // self.step_rows) * self.step_rows)
        ahead = min(self.capacity, max(exact, -(-(rows + self.reserved // 8) // self.step_rows) * self.step_rows))
        try:
            self._allocate(ahead)
            return
        except OSError as exc:
            if exc.errno not in _FULL or ahead == exact:
                self._failed(exc, rows)
        try:                    # a full disk: maybe what this call needs still fits
            self._allocate(exact)
        except OSError as exc:
            self._failed(exc, rows)

    def released(self, rows: int) -> None:
        """The files were punched out past row ``rows`` (arena.release): that disk is given back."""
        self.reserved = min(self.reserved, rows)

    def _allocate(self, rows: int) -> None:
        for path, offset, stride in self.files:
            fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0))
            try:
                start = offset + self.reserved * stride
                os.posix_fallocate(fd, start, offset + rows * stride - start)
            finally:
                os.close(fd)
        self.reserved = rows

    def _failed(self, exc: OSError, rows: int) -> None:
        name = f"table {self.table!r}" if self.table is not None else "a table"
        if exc.errno not in _FULL:
            raise TierFull(f"{name}: its disk tier in {self.directory} could not reserve space for rows "
                           f"{self.reserved}..{rows - 1}: {exc.strerror or exc}; the table takes no new rows "
                           f"until that is fixed") from exc
        needed, free = self.bytes_for(self.reserved, rows), free_bytes(self.directory)
        what = "a quota" if exc.errno == errno.EDQUOT else "the file system"
        raise TierFull(
            f"{name}: disk tier full: {self.directory} needs {needed} bytes ({show_bytes(needed)}) more for "
            f"rows {self.reserved}..{rows - 1} and {what} there has {max(free, 0)} bytes "
            f"({show_bytes(max(free, 0))}) free; the table keeps the rows it has and takes no new "
            f"ones. Free space there, or put the tier on a larger disk (--checkpoint-dir or --run-dir: "
            f"tier/ under it; without either, TMPDIR), or let fewer rows live (eviction, a smaller id "
            f"space)") from exc
