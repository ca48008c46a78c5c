"""The checkpoint on disk: numpy arrays plus one JSON manifest, committed atomically.

    ROOT/
      latest                        {"checkpoint": "step-00000120"}: the newest complete checkpoint
      step-00000120/
        manifest.json               what is where: settings, shapes, dtypes, CRC-32 of every file
        dense/p0.values.npy         one file per parameter (whole, not per block: a checkpoint
        dense/p0.slot0.npy          loads onto any number of servers and any dispatch)
        sparse/t0/ids.npy           every row of a table, from every server, with its state
        sparse/t0/values.npy ...
      trainers/step-00000120/trainer-1.json   each trainer's own position (written by itself)

A checkpoint is written under a temporary name in ROOT and renamed into place
when complete, then ``latest`` is replaced (also by rename): a crash at any
moment leaves the previous checkpoint whole and ``latest`` pointing at it.
Readers verify every file against the manifest and name the one that does not
match. Arrays are .npy files (``numpy.load`` reads them; no pickles).

A checkpoint read from disk is untrusted data: readers refuse, with one
CheckpointError naming the entry, any name that leaves the checkpoint (paths.py:
``..``, absolute paths, symlinks out, ``latest`` naming anything but a step
directory of its root), a manifest or position file that does not follow its
schema (manifest.py, positions.py), and any .npy file whose header disagrees
with the manifest or with the file's size, before allocating anything (npy.py).
"""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import time
import uuid
import zlib
from pathlib import Path

import numpy as np

from paramshard.checkpoint.errors import CheckpointError     # callers import it from here too
from paramshard.checkpoint.jsonfile import MAX_LATEST_BYTES, MAX_MANIFEST_BYTES, MAX_POSITION_BYTES, read_json
from paramshard.checkpoint.manifest import FORMAT, FORMAT_VERSION, check_manifest
from paramshard.checkpoint.npy import load_npy
from paramshard.checkpoint.paths import confined
from paramshard.checkpoint.positions import check_position

MANIFEST = "manifest.json"
_NPY_HEADER = 128               # numpy's .npy header: 128 bytes for any array a checkpoint holds
LATEST = "latest"
_STEP_DIR = re.compile(r"step-([0-9]{8,})")     # fullmatch: no trailing newline, ASCII digits


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


class _CrcWriter:
    """A file that keeps the CRC-32 and length of what is written through it."""

    def __init__(self, f):
        self.f, self.crc, self.bytes = f, 0, 0

    def write(self, data) -> int:
        self.crc = zlib.crc32(data, self.crc)
        self.bytes += len(data)
        return self.f.write(data)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _free_bytes(folder: Path) -> int | None:
    try:
        st = os.statvfs(folder)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def write_failed(path: Path, exc: OSError, needed: int, written: int = 0) -> CheckpointError:
    """The error of a checkpoint file that could not be written: which file, and for a full disk
    (or quota) the bytes it needed and those left, so the user knows where and how much to free."""
    free = _free_bytes(path.parent)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        what = "no space left" if exc.errno == errno.ENOSPC else "disk quota exceeded"
        so_far = f"; this checkpoint had {written:,} bytes written before it" if written else ""
        left = f", {free:,} bytes free there" if free is not None else ""
        return CheckpointError(f"checkpoint: {what} writing {path}: it needs about {needed:,} bytes{left}{so_far}; free "
                               f"space on that file system or give a --checkpoint-dir with room (the previous "
                               f"checkpoint is kept whole)")
    return CheckpointError(f"checkpoint: cannot write {path} ({exc.strerror or exc}); the previous checkpoint is "
                           f"kept whole")


def write_json_atomically(path: Path, data) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    text = json.dumps(data, indent=1)
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise write_failed(path, exc, len(text.encode())) from exc


class CheckpointWriter:
    """Files of one checkpoint, written under a temporary directory until ``commit``."""

    def __init__(self, root, step: int):
        self.root = Path(root)
        self.step = step
        self.root.mkdir(parents=True, exist_ok=True)
        self.tmp = self.root / f".tmp-{step_dir_name(step)}-{uuid.uuid4().hex[:8]}"
        self.tmp.mkdir()
        self.files: dict[str, dict] = {}
        self.bytes = 0

    def put(self, relpath: str, array: np.ndarray) -> None:
        path = self.tmp / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        array = np.ascontiguousarray(array)
        try:
            with open(path, "wb") as f:
                w = _CrcWriter(f)
                np.lib.format.write_array(w, array, allow_pickle=False)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:          # a full disk above all: which file, how many bytes
            raise write_failed(path, exc, array.nbytes + _NPY_HEADER, self.bytes) from exc
        self.files[relpath] = {"bytes": w.bytes, "crc32": w.crc, "dtype": array.dtype.str,
                               "shape": list(array.shape)}
        self.bytes += w.bytes

    def commit(self, manifest: dict, keep: int | None = None) -> Path:
        """Write the manifest, move the checkpoint into place, point ``latest`` at it,
        and delete all but the newest ``keep``."""
        manifest = {"format": FORMAT, "version": FORMAT_VERSION, "step": self.step,
                    "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **manifest, "files": self.files}
        write_json_atomically(self.tmp / MANIFEST, manifest)
        _fsync_dir(self.tmp)
        final = self.root / step_dir_name(self.step)
        if final.exists():      # the same step saved again (e.g. the final save right after a periodic one)
            shutil.rmtree(final)
        os.rename(self.tmp, final)
        _fsync_dir(self.root)
        write_json_atomically(self.root / LATEST, {"checkpoint": final.name})
        if keep is not None:
            prune(self.root, keep)
        return final

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def checkpoints(root) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        step = _STEP_DIR.fullmatch(p.name)
        if step and (p / MANIFEST).is_file():
            found.append((int(step.group(1)), p))
    return [p for _, p in sorted(found, key=lambda f: f[0])]


def prune(root, keep: int) -> None:
    if keep < 1:
        raise CheckpointError(f"--keep {keep}: keep at least one checkpoint")
    done = checkpoints(root)
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(Path(root) / "trainers" / old.name, ignore_errors=True)
    for stale in Path(root).glob(".tmp-step-*"):       # left by a crash mid-save
        if stale.is_dir() and time.time() - stale.stat().st_mtime > 3600:
            shutil.rmtree(stale, ignore_errors=True)


def _step_dir(root: Path, name: str, what: str) -> Path:
    """``root / name`` when ``name`` is a step directory's name and it stays in ``root``
    once symlinks are resolved (a step directory linked elsewhere is not this root's)."""
    if not isinstance(name, str) or not _STEP_DIR.fullmatch(name):
        raise CheckpointError(f"{what} names {name!r}, not a step-NNNNNNNN directory of {root}: refused; "
                              f"pass a step-NNNNNNNN directory instead")
    confined(root, name, "step directory")
    return root / name


def _read_latest(root: Path) -> Path:
    latest = root / LATEST
    data = read_json(latest, MAX_LATEST_BYTES, "latest pointer", confined(root, LATEST, "latest pointer"))
    if not isinstance(data, dict) or "checkpoint" not in data:
        raise CheckpointError(f"{latest}: unreadable (not {{\"checkpoint\": \"step-NNNNNNNN\"}}); pass a "
                              f"step-NNNNNNNN directory instead")
    return _step_dir(root, data["checkpoint"], str(latest))


def resolve(path) -> Path:
    """A checkpoint directory from either a step directory or a root (its ``latest``)."""
    path = Path(path)
    try:
        return _resolve(path)
    except OSError as exc:          # e.g. a directory this user may not list
        raise CheckpointError(f"{path}: cannot read the checkpoint ({exc.strerror or exc})") from None


def _resolve(path: Path) -> Path:
    if (path / MANIFEST).is_file():
        return path
    latest = path / LATEST
    if latest.is_file() or latest.is_symlink():
        target = _read_latest(path)
        if (target / MANIFEST).is_file():
            return target
        raise CheckpointError(f"{latest} names {target.name}, which is missing or incomplete")
    done = checkpoints(path)
    if done:
        return _step_dir(path, done[-1].name, f"{path}: the newest checkpoint")
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    raise CheckpointError(f"{path} holds no checkpoint (no {MANIFEST}, no {LATEST}, no step-* directory)")


class Checkpoint:
    """A complete checkpoint, read and verified file by file. Nothing is read from outside
    its directory (trainer positions: outside its root), and the manifest is checked
    against its schema here, before any field of it is used."""

    def __init__(self, path):
        self.path = resolve(path)
        manifest_path = self.path / MANIFEST
        manifest = read_json(manifest_path, MAX_MANIFEST_BYTES, "manifest",
                             confined(self.path, MANIFEST, "manifest"))
        self.manifest = check_manifest(manifest, manifest_path)

    @property
    def step(self) -> int:
        return self.manifest["step"]

    @property
    def root(self) -> Path:
        return self.path.parent

    def array(self, relpath: str) -> np.ndarray:
        """One array, checked against the manifest (size, CRC-32, dtype, shape) before it is allocated."""
        meta = self.manifest["files"].get(relpath) if isinstance(relpath, str) else None
        if meta is None:
            raise CheckpointError(f"{self.path}: the manifest lists no file {relpath}")
        return load_npy(self.path / relpath, meta, confined(self.path, relpath, "file entry"))

    def trainer_position(self, trainer: int) -> dict | None:
        """Trainer ``trainer``'s position at this checkpoint, schema-checked (None: it saved none)."""
        # Named by the step, as write_trainer_position names it (not by this directory's name,
        # which a user may have renamed, and which is no plain path component then).
        relpath = f"trainers/{step_dir_name(self.step)}/trainer-{int(trainer)}.json"
        path = self.root / relpath
        if not (path.is_file() or path.is_symlink()):
            return None
        data = read_json(path, MAX_POSITION_BYTES, "trainer position",
                         confined(self.root, relpath, "trainer position"))
        return check_position(data, self.step, path)


def write_trainer_position(root, step: int, trainer: int, position: dict) -> None:
    directory = Path(root) / "trainers" / step_dir_name(step)
    directory.mkdir(parents=True, exist_ok=True)
    write_json_atomically(directory / f"trainer-{trainer}.json", position)
