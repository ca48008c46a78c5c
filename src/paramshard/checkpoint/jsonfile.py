"""A checkpoint's JSON files (manifest, ``latest``, trainer positions), read with a bound.

``json.loads`` of an unbounded file can take all memory, and a deeply nested
one ends in RecursionError: both must be one CheckpointError naming the file.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from paramshard.checkpoint.errors import CheckpointError
from paramshard.checkpoint.paths import open_regular

MAX_LATEST_BYTES = 4096
MAX_POSITION_BYTES = 64 << 20      # a trainer's script state is the script's: generous
MAX_MANIFEST_BYTES = 256 << 20     # ~100 bytes per file and plan block: millions of blocks fit


def first_line(exc: BaseException) -> str:
    """An exception's message as one short line (numpy's and json's may span several)."""
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]


def read_json(path: Path, limit: int, what: str, opened: Path | None = None):
    """The parsed JSON of ``path`` (``opened``: the confined path to open, when it differs
    from the name shown). Refuses files over ``limit`` bytes before reading them."""
    try:
        with open_regular(opened or path, what) as f:
            size = os.fstat(f.fileno()).st_size
            data = f.read(limit + 1)        # never more, even if the file grew since fstat
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    if max(size, len(data)) > limit:
        raise CheckpointError(f"{path}: the {what} is {max(size, len(data))} bytes, more than the {limit} "
                              f"a {what} may have: refused (not a paramshard checkpoint?)")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:     # UnicodeDecodeError is a ValueError
        raise CheckpointError(f"{path}: unreadable {what} ({first_line(exc)})") from None
