"""What every line-oriented reader shares: chunked file reading, file:line
bookkeeping, skip-or-raise on bad lines, and re-batching to a fixed size."""
from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import Generic, Iterable, Iterator, Sequence, TypeVar

import numpy as np

from paramshard.errors import ConfigError
from paramshard.log import get_logger
from paramshard.data.errors import DataFormatError

DEFAULT_CHUNK_BYTES = 1 << 20  # ~5k Criteo lines: big enough to amortise numpy overhead
# Far above any real CTR line (Criteo's are ~200 bytes). Without a cap, a file with no
# newlines (binary data, a wrong export) is held whole in memory as one "line".
MAX_LINE_BYTES = 1 << 20
MAX_EXAMPLES = 5
# gzip's own errors for: a cut-off stream; not gzip at all or a bad CRC; damaged deflate data.
# None names the file, and BadGzipFile is an OSError, which callers take for "cannot open".
_GZIP_ERRORS = (EOFError, gzip.BadGzipFile, zlib.error)

log = get_logger("data")


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


def check_max_line_bytes(max_line_bytes: int) -> None:
    if max_line_bytes < 1:
        raise ConfigError(f"max_line_bytes={max_line_bytes}: must be >= 1")


def open_input(path: Path):
    # Criteo's day files usually ship gzipped; reading them as-is saves a 3x larger copy.
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def read_blocks(path: Path, block_bytes: int) -> Iterator[bytes]:
    """The file's bytes (decompressed if .gz) in blocks of at most ``block_bytes``.

    A broken .gz raises DataFormatError naming the file and the fix. An empty file
    is only warned about: it is valid, but usually a failed download or export.
    """
    empty = True
    with open_input(path) as f:
        while True:
            try:
                block = f.read(block_bytes)
            except _GZIP_ERRORS as exc:
                raise _gzip_error(path, exc) from exc
            if not block:
                break
            empty = False
            yield block
    if empty:
        what = "0 bytes" if path.stat().st_size == 0 else "no lines after decompression"
        log.warning("%s: empty input file (%s), it adds no data; check that it was downloaded "
                    "or written completely", path, what)


def _gzip_error(path: Path, exc: Exception) -> DataFormatError:
    if isinstance(exc, EOFError):
        reason = "is not a complete gzip file (truncated download?): re-fetch it, or check it with gunzip -t"
    elif not _starts_like_gzip(path):
        reason = ("is not gzip data although its name ends in .gz: if it is plain text, "
                  "rename it without .gz; otherwise re-fetch it")
    else:
        reason = f"is a corrupt gzip file ({exc}): re-fetch it, or check it with gunzip -t"
    return DataFormatError(path, None, reason, hint=None)


def _starts_like_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def _too_long(path: Path, line_no: int | None, max_line_bytes: int) -> DataFormatError:
    return DataFormatError(path, line_no, f"line is longer than {max_line_bytes} bytes (max_line_bytes)",
                           hint="a file without newlines, such as binary data, reads as one long line; "
                                "if the lines really are this long, pass a larger max_line_bytes")


def _unix(chunk: bytes) -> bytes:
    return chunk.replace(b"\r\n", b"\n") if b"\r" in chunk else chunk  # skip the copy when clean


def iter_lines(path: Path, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
               max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes]]:
    """(1-based number of the block's first line, whole lines each ending in b'\\n'),
    bytes as in the file except that a missing final newline is added.

    A line longer than ``max_line_bytes`` (not counting its b'\\n') raises
    DataFormatError as soon as that much of it is read, so whatever the file holds,
    at most max_line_bytes + chunk_bytes of it are held (twice that while the
    pieces of a long line are joined).
    """
    line_no = 1
    # The pieces of a line not ended yet. Joined once, when it ends: re-joining them at
    # every block (rest + block) made a long line cost quadratic time.
    partial: list[bytes] = []
    partial_len = 0
    for block in read_blocks(path, chunk_bytes):
        end = block.rfind(b"\n") + 1
        if end:
            _check_line_lengths(path, line_no, partial_len, block, end, max_line_bytes)
            lines = b"".join([*partial, memoryview(block)[:end]]) if partial else block[:end]
            yield line_no, lines
            line_no += lines.count(b"\n")
            partial, partial_len = [], 0
            block = block[end:]
        if block:
            partial.append(block)
            partial_len += len(block)
            if partial_len > max_line_bytes:
                raise _too_long(path, line_no, max_line_bytes)
    if partial:
        yield line_no, b"".join([*partial, b"\n"])


def _check_line_lengths(path, line_no, partial_len, block, end, max_line_bytes) -> None:
    """Raise if a line ending in ``block[:end]`` is too long. The first began
    ``partial_len`` bytes before the block; the others lie wholly inside it."""
    first = block.find(b"\n")
    if partial_len + first > max_line_bytes:
        raise _too_long(path, line_no, max_line_bytes)
    if end - first - 1 <= max_line_bytes:
        return  # the other lines together are short enough: skip the scan (always, by default)
    ends = np.flatnonzero(np.frombuffer(block, np.uint8, count=end) == ord("\n"))
    too_long = np.flatnonzero(np.diff(ends) - 1 > max_line_bytes)
    if len(too_long):
        raise _too_long(path, line_no + 1 + int(too_long[0]), max_line_bytes)


def iter_chunks(path: Path, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes]]:
    """(1-based number of the chunk's first line, whole lines each ending in b'\\n').

    A missing final newline is added, and CRLF becomes LF, so parsers see one shape.
    """
    for line_no, lines in iter_lines(path, chunk_bytes, max_line_bytes):
        yield line_no, _unix(lines)


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


BatchT = TypeVar("BatchT")


class LineReader(Generic[BatchT]):
    """Base of the format readers (``BatchT``: the batch type ``_parse`` makes). Subclasses implement ``_parse(chunk)`` returning
    (batch of the good lines, [(0-based line index in chunk, reason), ...]) and
    ``_concat(batches)``.

    Iterating again starts a new pass (epoch) and resets ``bad_lines``.
    """

    def __init__(self, paths, batch_size: int, skip_bad_lines: bool = False,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, max_line_bytes: int = MAX_LINE_BYTES):
        if batch_size < 1:
            raise ConfigError(f"batch_size={batch_size}: must be >= 1")
        if chunk_bytes < 1:
            raise ConfigError(f"chunk_bytes={chunk_bytes}: must be >= 1")
        check_max_line_bytes(max_line_bytes)
        self.paths: Sequence[Path] = as_paths(paths)
        self.batch_size = batch_size
        self.skip_bad_lines = skip_bad_lines
        self.chunk_bytes = chunk_bytes
        self.max_line_bytes = max_line_bytes
        self.bad_lines = 0
        self.bad_line_examples: list[str] = []  # first MAX_EXAMPLES messages, for a report
        self.epoch = -1          # passes started (0 during the first)
        self.batches = 0         # batches handed out in the current pass
        self._resume_at: dict | None = None

    # -- position, for checkpoints (Trainer.save(state=...)) -------------------
    def state(self) -> dict:
        """Where this reader is: the pass and how many batches of it were handed out.
        JSON; save it with ``trainer.save(state={"reader": reader.state()})``."""
        return {"epoch": self.epoch, "batches": self.batches}

    def restore(self, state: dict) -> None:
        """Continue from ``state``: the next pass is the saved one and starts after the
        batches it had handed out (they are read again to be skipped, so bad-line
        accounting and batch boundaries come out exactly as in the first run)."""
        try:
            epoch, batches = max(0, int(state["epoch"])), int(state["batches"])
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"reader state {state!r}: expected {{'epoch': int, 'batches': int}}") from None
        if batches < 0:
            raise ConfigError(f"reader state {state!r}: batches must be >= 0")
        self._resume_at = {"epoch": epoch, "batches": batches}

    def _parse(self, chunk: bytes) -> tuple[BatchT, list[tuple[int, str]]]:
        raise NotImplementedError

    def read_task(self, task) -> Iterator[tuple[BatchT, int]]:
        """(batch, position of the next unread record) over one shard task's records
        (data/shards/tasks.py; ``task.file`` indexes ``paths``), read directly from its range.
        Batches have ``batch_size`` records, fewer at the task's end or where bad lines
        were skipped; stopping after any batch, ``task.rest(position)`` is exactly the rest."""
        from paramshard.data.readers.ranges import line_groups
        path = self.paths[task.file]
        for chunk, first, next_pos in line_groups(path, task, self.batch_size, self.chunk_bytes,
                                                  self.max_line_bytes):
            batch, bad = self._parse(chunk)
            unit = "record" if task.kind == "gzip" else "byte"
            for index, reason in bad:
                err = DataFormatError(path, None, f"line {index + 1} of the lines from {unit} {first}: {reason}")
                if not self.skip_bad_lines:
                    raise err
                self.bad_lines += 1
                if len(self.bad_line_examples) < MAX_EXAMPLES:
                    self.bad_line_examples.append(err.short)
            yield batch, next_pos

    def _concat(self, batches):
        raise NotImplementedError

    def _good_batches(self):
        for path in self.paths:
            for first_line, chunk in iter_chunks(path, self.chunk_bytes, self.max_line_bytes):
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
        skip = 0
        if self._resume_at is not None:
            self.epoch, skip = self._resume_at["epoch"] - 1, self._resume_at["batches"]
            self._resume_at = None
        self.epoch += 1
        return self._counted(rebatch(self._good_batches(), self.batch_size, self._concat), skip)

    def _counted(self, batches, skip: int):
        self.batches = 0
        for batch in batches:
            self.batches += 1
            if self.batches > skip:
                yield batch
