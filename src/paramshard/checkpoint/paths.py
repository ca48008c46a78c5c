"""Where a checkpoint reader may look: inside the checkpoint, never outside it.

A checkpoint is data from disk, maybe copied from someone else: its manifest
names files, ``latest`` names a step directory, and any of them may be a
symlink. A name like ``../../x.npy``, ``/abs/x.npy`` or a symlink out of the
checkpoint would let it make a reader open (and echo in errors, or export)
files that are not the checkpoint's. Every name is checked as text first
(``check_relpath``), then resolved with its symlinks (``confined``), and the
file is opened only if it is a regular file (``open_regular``: a FIFO would
block the reader forever).
"""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from paramshard.checkpoint.errors import CheckpointError
from paramshard.checkpoint.manifest_schema import show

# One path component: what the writer produces (dense/p0.values.npy, sparse/t3/slot0.npy),
# never "." / ".." / hidden names, never a separator or NUL.
_COMPONENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")      # fullmatch: "$" would let a newline end it
MAX_RELPATH = 512


def relpath_problem(relpath) -> str | None:
    """Why ``relpath`` is not a plain relative path inside a checkpoint (None: it is)."""
    if not isinstance(relpath, str) or not relpath:
        return "is not a file name"
    if len(relpath) > MAX_RELPATH:
        return f"is longer than {MAX_RELPATH} characters"
    if relpath.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", relpath):
        return "is an absolute path, outside the checkpoint"
    parts = relpath.split("/")
    if ".." in parts or ".." in relpath.split("\\"):
        return "climbs out of the checkpoint ('..')"
    if not all(_COMPONENT.fullmatch(p) for p in parts):
        return "is not a plain relative path (letters, digits, '_', '.', '-' between '/')"
    return None


def confined(base: Path, relpath: str, what: str) -> Path:
    """``base / relpath`` once its symlinks are resolved, refused unless it is still
    inside ``base`` (itself resolved: a checkpoint directory reached through a symlink
    is fine, a file inside it pointing elsewhere is not)."""
    problem = relpath_problem(relpath)
    if problem:
        raise CheckpointError(f"{base}: {what} {show(relpath)} {problem}: refused")
    try:
        anchor = base.resolve()
        target = (anchor / relpath).resolve()
    except (OSError, RuntimeError) as exc:        # a symlink loop: RuntimeError before Python 3.13
        raise CheckpointError(f"{base}: {what} {relpath!r} cannot be resolved ({exc}): refused") from None
    if target != anchor and anchor not in target.parents:
        raise CheckpointError(f"{base}: {what} {relpath!r} resolves to {target}, outside {anchor} (a symlink "
                              f"out of the checkpoint): refused; copy the file into the checkpoint instead")
    return target


def open_regular(path: Path, what: str):
    """``path`` opened for binary reading, only if it is a regular file. O_NONBLOCK: opening
    a FIFO must not wait for a writer; it is then refused by the fstat check."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CheckpointError(f"{path}: {what} is not a regular file: refused")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
