"""The position of a DirectoryStream, as JSON, and its checks (data/stream/directory.py).

    {"source": "directory", "version": 1, "rank": 0, "world": 2,
     "files": {"events-001.csv": {"bytes": 4096, "records": 120},    # CSV, JSON lines: whole lines
               "events-002.parquet": {"records": 500}}}               # Parquet: rows

``bytes``: the file's bytes consumed, always at a line end (header included); ``records``: the
file's records before that point, every rank's (record j of a file is rank j % world's), so the
next record's index is known without reading the file again. Every file this reader has looked
at is named, fully read or not, so a resumed reader never takes a file's records twice.

A position given back is checked whole before anything moves: a damaged one is a PositionError
naming the field (``files['a.csv'].bytes``), never a silent restart from another place.
"""
from __future__ import annotations

import os

from paramshard.data.stream.errors import PositionError

SOURCE = "directory"
VERSION = 1
LINE_FORMATS = ("csv", "jsonl")


def check(position, rank: int, world: int) -> dict[str, dict]:
    """``position``'s files ({name: {"bytes"?, "records"}}) when it is a directory position of
    this rank and world; else PositionError naming the field."""
    if not isinstance(position, dict):
        raise PositionError(f"a DirectoryStream position must be a JSON object, got {type(position).__name__}")
    for key, expected in (("source", SOURCE), ("version", VERSION)):
        if position.get(key) != expected:
            raise PositionError(f"position field {key!r} is {position.get(key)!r}, expected {expected!r}: not the "
                                f"position of a DirectoryStream (or of another version of it)")
    for key, mine in (("rank", rank), ("world", world)):
        value = position.get(key)
        if not _whole(value):
            raise PositionError(f"position field {key!r} must be a whole number >= 0, got {value!r}")
        if value != mine:
            raise PositionError(f"the position was saved by rank {position['rank']} of world {position['world']}, "
                                f"this reader is rank {rank} of world {world}: resume a stream with the same "
                                f"number of trainers (each rank's records are its own)")
    files = position.get("files")
    if not isinstance(files, dict):
        raise PositionError(f"position field 'files' must be a JSON object, got {type(files).__name__}")
    checked = {}
    for name, entry in files.items():
        where = f"files[{name!r}]"
        if not isinstance(name, str) or not name or os.sep in name or "/" in name or name in (".", ".."):
            raise PositionError(f"position {where}: not a file name of the stream's directory")
        if not isinstance(entry, dict):
            raise PositionError(f"position {where} must be a JSON object, got {type(entry).__name__}")
        unknown = set(entry) - {"bytes", "records"}
        if unknown:
            raise PositionError(f"position {where} has unknown fields {sorted(unknown)}")
        for key in entry:
            if not _whole(entry[key]):
                raise PositionError(f"position {where}.{key} must be a whole number >= 0, got {entry[key]!r}")
        if "records" not in entry:
            raise PositionError(f"position {where} has no 'records'")
        checked[name] = dict(entry)
    return checked


def check_against_file(name: str, entry: dict, path: str, kind: str) -> None:
    """The file ``path`` as it is now can hold ``entry``'s place: a line file is at least that long
    and ``bytes`` is at a line end (a truncated or replaced file, or a damaged number, is refused)."""
    if kind not in LINE_FORMATS:
        if "bytes" in entry:
            raise PositionError(f"position files[{name!r}].bytes: {name} is a {kind} file, read by rows")
        return
    if "bytes" not in entry:
        raise PositionError(f"position files[{name!r}] has no 'bytes' ({name} is a {kind} file)")
    offset = entry["bytes"]
    if offset == 0:
        if entry["records"]:
            raise PositionError(f"position files[{name!r}]: {entry['records']} records in 0 bytes")
        return
    size = os.path.getsize(path)
    if size < offset:
        raise PositionError(f"position files[{name!r}].bytes is {offset}, but {path} has {size} bytes: the file was "
                            f"truncated or replaced since the position was saved (streamed files are append-only)")
    with open(path, "rb") as f:
        f.seek(offset - 1)
        if f.read(1) != b"\n":
            raise PositionError(f"position files[{name!r}].bytes={offset} is not at a line end of {path}: a damaged "
                                f"position, or the file was rewritten")


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
