"""What every line-oriented reader shares: chunked file reading, file:line
bookkeeping, skip-or-raise on bad lines, and re-batching to a fixed size."""
from __future__ import annotations

import gzip
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from ..errors import ConfigError
from .errors import DataFormatError

DEFAULT_CHUNK_BYTES = 1 << 20  # ~5k Criteo lines: big enough to amortise numpy overhead
MAX_EXAMPLES = 5


def as_paths(paths) -> list[Path]:
    """One path or a list of them; every one must be an existing file."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    out = [Path(p) for p in paths]
    if not out:
        raise ConfigError("no input files given")
    for p in out:
        if p.is_dir():
            raise ConfigError(f"{p}: is a directory; pass its files (for a split-data "
                              "directory: shard_files(dir, trainer_id, num_trainers))")
        if not p.is_file():
            raise ConfigError(f"{p}: no such file")
    return out


def open_input(path: Path):
    # Criteo's day files usually ship gzipped; reading them as-is saves a 3x larger copy.
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def _unix(chunk: bytes) -> bytes:
    return chunk.replace(b"\r\n", b"\n") if b"\r" in chunk else chunk  # skip the copy when clean


def iter_chunks(path: Path, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[tuple[int, bytes]]:
    """(1-based number of the chunk's first line, whole lines each ending in b'\\n').

    A missing final newline is added, and CRLF becomes LF, so parsers see one shape.
    """
    line_no = 1
    rest = b""
    with open_input(path) as f:
        while True:
            block = f.read(chunk_bytes)
            if not block:
                break
            data = rest + block
            cut = data.rfind(b"\n") + 1
            if cut == 0:  # a line longer than the chunk: keep reading
                rest = data
                continue
            chunk, rest = data[:cut], data[cut:]
            yield line_no, _unix(chunk)
            line_no += chunk.count(b"\n")
    if rest:
        yield line_no, _unix(rest + b"\n")


def rebatch(batches: Iterable, batch_size: int, concat) -> Iterator:
    """Re-cut variable-sized batches into ``batch_size`` rows (the last may be short)."""
    pending, count = [], 0
    for b in batches:
        if len(b) == 0:
            continue
        pending.append(b)
        count += len(b)
        if count >= batch_size:
            merged = pending[0] if len(pending) == 1 else concat(pending)
            full = count - count % batch_size
            for start in range(0, full, batch_size):
                yield merged.take(start, start + batch_size)
            pending = [merged.take(full, count)] if full < count else []
            count -= full
    if count:
        yield pending[0] if len(pending) == 1 else concat(pending)


class LineReader:
    """Base of the format readers. Subclasses implement ``_parse(chunk)`` returning
    (batch of the good lines, [(0-based line index in chunk, reason), ...]) and
    ``_concat(batches)``.

    Iterating again starts a new pass (epoch) and resets ``bad_lines``.
    """

    def __init__(self, paths, batch_size: int, skip_bad_lines: bool = False,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES):
        if batch_size < 1:
            raise ConfigError(f"batch_size={batch_size}: must be >= 1")
        if chunk_bytes < 1:
            raise ConfigError(f"chunk_bytes={chunk_bytes}: must be >= 1")
        self.paths: Sequence[Path] = as_paths(paths)
        self.batch_size = batch_size
        self.skip_bad_lines = skip_bad_lines
        self.chunk_bytes = chunk_bytes
        self.bad_lines = 0
        self.bad_line_examples: list[str] = []  # first MAX_EXAMPLES messages, for a report

    def _parse(self, chunk: bytes):
        raise NotImplementedError

    def _concat(self, batches):
        raise NotImplementedError

    def _good_batches(self):
        for path in self.paths:
            for first_line, chunk in iter_chunks(path, self.chunk_bytes):
                batch, bad = self._parse(chunk)
                for index, reason in bad:
                    err = DataFormatError(path, first_line + index, reason)
                    if not self.skip_bad_lines:
                        raise err
                    self.bad_lines += 1
                    if len(self.bad_line_examples) < MAX_EXAMPLES:
                        self.bad_line_examples.append(err.short)
                yield batch

    def __iter__(self):
        self.bad_lines = 0
        self.bad_line_examples = []
        return rebatch(self._good_batches(), self.batch_size, self._concat)
