"""The checkpoint on disk: numpy arrays plus one JSON manifest, committed atomically.

    ROOT/
      latest                        "step-00000120": the newest complete checkpoint
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
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
import zlib
from pathlib import Path

import numpy as np

from ..errors import ConfigError

FORMAT = "paramshard-checkpoint"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
LATEST = "latest"
_STEP_DIR = re.compile(r"^step-(\d{8,})$")
_CHUNK = 64 << 20


class CheckpointError(ConfigError):
    """A checkpoint is missing, incomplete or does not match its manifest."""


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


def file_crc(path: Path) -> tuple[int, int]:
    crc, size = 0, 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return crc, size


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomically(path: Path, data) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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
        with open(path, "wb") as f:
            w = _CrcWriter(f)
            np.lib.format.write_array(w, array, allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())
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
    found = [p for p in root.iterdir() if _STEP_DIR.match(p.name) and (p / MANIFEST).is_file()]
    return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))


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


def resolve(path) -> Path:
    """A checkpoint directory from either a step directory or a root (its ``latest``)."""
    path = Path(path)
    if (path / MANIFEST).is_file():
        return path
    latest = path / LATEST
    if latest.is_file():
        try:
            name = json.loads(latest.read_text())["checkpoint"]
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{latest}: unreadable ({exc}); pass a step-NNNNNNNN directory instead") from None
        target = path / name
        if (target / MANIFEST).is_file():
            return target
        raise CheckpointError(f"{latest} names {name}, which is missing or incomplete")
    done = checkpoints(path)
    if done:
        return done[-1]
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    raise CheckpointError(f"{path} holds no checkpoint (no {MANIFEST}, no {LATEST}, no step-* directory)")


class Checkpoint:
    """A complete checkpoint, read and verified file by file."""

    def __init__(self, path):
        self.path = resolve(path)
        manifest_path = self.path / MANIFEST
        try:
            self.manifest = json.loads(manifest_path.read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{manifest_path}: unreadable manifest ({exc})") from None
        if self.manifest.get("format") != FORMAT:
            raise CheckpointError(f"{manifest_path}: not a paramshard checkpoint manifest")
        if self.manifest.get("version") != FORMAT_VERSION:
            raise CheckpointError(f"{manifest_path}: format version {self.manifest.get('version')}, this "
                                  f"paramshard reads version {FORMAT_VERSION}")

    @property
    def step(self) -> int:
        return self.manifest["step"]

    @property
    def root(self) -> Path:
        return self.path.parent

    def array(self, relpath: str) -> np.ndarray:
        """One array, checked against the manifest (size, CRC-32, dtype, shape)."""
        meta = self.manifest["files"].get(relpath)
        if meta is None:
            raise CheckpointError(f"{self.path}: the manifest lists no file {relpath}")
        path = self.path / relpath
        try:
            crc, size = file_crc(path)
        except OSError as exc:
            raise CheckpointError(f"{path}: cannot read ({exc.strerror})") from None
        if size != meta["bytes"]:
            raise CheckpointError(f"{path}: {size} bytes, the manifest says {meta['bytes']} (truncated?)")
        if crc != meta["crc32"]:
            raise CheckpointError(f"{path}: CRC-32 {crc:#010x} does not match the manifest's "
                                  f"{meta['crc32']:#010x} (corrupted)")
        array = np.load(path, allow_pickle=False)
        if array.dtype.str != meta["dtype"] or list(array.shape) != meta["shape"]:
            raise CheckpointError(f"{path}: {array.dtype}{list(array.shape)}, the manifest says "
                                  f"{meta['dtype']}{meta['shape']}")
        return array

    def trainer_position(self, trainer: int) -> dict | None:
        path = self.root / "trainers" / self.path.name / f"trainer-{trainer}.json"
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except ValueError as exc:
            raise CheckpointError(f"{path}: unreadable ({exc})") from None


def write_trainer_position(root, step: int, trainer: int, position: dict) -> None:
    directory = Path(root) / "trainers" / step_dir_name(step)
    directory.mkdir(parents=True, exist_ok=True)
    write_json_atomically(directory / f"trainer-{trainer}.json", position)
