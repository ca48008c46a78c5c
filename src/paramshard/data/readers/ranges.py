"""Read one shard task's records directly (data/shards/tasks.py): seek to the range, no
reading from the file's start.

``line_groups(path, task, lines)`` yields groups of at most ``lines`` whole lines
(each ending in b'\\n', CRLF made LF, as iter_chunks gives them) with the position
of the next unread record after each group: a byte offset for a text range, a
record count for a .gz file. A reader that stops after any group can hand
``task.rest(position)`` to someone else, and that remainder reads exactly the
records it did not.

Hadoop's split rule: a range [start, end) owns the lines whose first byte lies in
it. Reading starts at the first line start at or after ``start`` (``start`` itself
when the byte before it is a newline) and takes every line that starts before
``end``, the last one possibly running past ``end``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from paramshard.errors import ConfigError
from paramshard.data.readers._reader import DEFAULT_CHUNK_BYTES, MAX_LINE_BYTES, _too_long, _unix, iter_lines
from paramshard.data.shards.tasks import Task


def first_line_start(f, start: int, max_line_bytes: int, path) -> int:
    """The offset of the first line that starts at or after ``start``."""
    if start <= 0:
        return 0
    f.seek(start - 1)
    rest = f.readline(max_line_bytes + 2)      # to the newline ending the line that holds start - 1
    if len(rest) > max_line_bytes + 1 and not rest.endswith(b"\n"):
        raise _too_long(Path(path), None, max_line_bytes)
    return start - 1 + len(rest)


def range_blocks(path, start: int, end: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes]]:
    """(file offset, whole lines as in the file) of the lines of [start, end), in blocks."""
    with open(path, "rb") as f:
        pos = first_line_start(f, start, max_line_bytes, path)
        f.seek(pos)
        partial = b""
        while pos < end:
            block = f.read(chunk_bytes)
            if not block:
                if partial:             # a last line without its newline
                    yield pos, partial + b"\n"
                return
            data = partial + block if partial else block
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                if len(data) > max_line_bytes:
                    raise _too_long(Path(path), None, max_line_bytes)
                partial = data
                continue
            lines, partial = data[:cut], data[cut:]
            if pos + cut > end:         # stop after the line holding byte end - 1
                lines = lines[:lines.find(b"\n", end - pos - 1) + 1]
                yield pos, lines
                return
            yield pos, lines
            pos += cut


def _gzip_blocks(path, skip: int, chunk_bytes: int, max_line_bytes: int) -> Iterator[tuple[int, bytes]]:
    """(records before the block, whole lines) of a .gz file from record ``skip`` on."""
    for line_no, lines in iter_lines(Path(path), chunk_bytes, max_line_bytes):
        first = line_no - 1
        count = lines.count(b"\n")
        if first + count <= skip:
            continue
        if first < skip:
            drop = skip - first
            at = 0
            for _ in range(drop):
                at = lines.index(b"\n", at) + 1
            lines, first = lines[at:], skip
        yield first, lines


def line_groups(path, task: Task, lines_per_group: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[bytes, int, int]]:
    """(group of at most ``lines_per_group`` LF lines, its first record's position, the next
    record's position) over the task's records, in order."""
    if lines_per_group < 1:
        raise ConfigError(f"lines_per_group={lines_per_group}: must be >= 1")
    if task.kind == "bytes":
        blocks, by_records = range_blocks(path, task.start, task.end, chunk_bytes, max_line_bytes), False
    elif task.kind == "gzip":
        blocks, by_records = _gzip_blocks(path, task.start, chunk_bytes, max_line_bytes), True
    else:
        raise ConfigError(f"task {task.id} of {path}: a {task.kind!r} task is not made of lines")
    pending: list[bytes] = []
    pending_lines, pending_pos = 0, None
    for pos, lines in blocks:
        ends = np.flatnonzero(np.frombuffer(lines, np.uint8) == ord("\n")) + 1
        at, taken = 0, 0
        while taken < len(ends):
            n = min(lines_per_group - pending_lines, len(ends) - taken)
            cut = int(ends[taken + n - 1])
            if pending_pos is None:
                pending_pos = pos + (taken if by_records else at)
            pending.append(lines[at:cut])
            pending_lines += n
            taken += n
            at = cut
            if pending_lines == lines_per_group:
                next_pos = pos + (taken if by_records else at)
                yield _unix(b"".join(pending)), pending_pos, next_pos
                pending, pending_lines, pending_pos = [], 0, None
        last_next = pos + (taken if by_records else at)
    if pending:
        assert pending_pos is not None          # set with the first line put in pending
        yield _unix(b"".join(pending)), pending_pos, last_next
