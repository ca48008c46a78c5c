"""Split input files into shard tasks: the units the data-shard service
(server/elastic/shard_service.py) hands to trainers as they ask.

- Plain text (CSV, TSV, Criteo, libsvm): byte ranges of about ``task_bytes``, with
  Hadoop's split rule: the range [start, end) owns the records whose first byte lies
  in it. A reader of a range skips to the first line start at or after ``start``
  (data/readers/ranges.py) and reads every line that starts before ``end``, so each record
  belongs to exactly one range whatever the split size. A CSV's header line belongs
  to no task (the first range starts after it).
- .gz: cannot be split (no seeking into a deflate stream): one task per file; its
  ``start`` counts records to skip (a remainder handed to another trainer).
- Parquet: ranges of whole row groups, as row numbers [start, end).

A task is (id, file index, start, end, kind); ``end`` is -1 for "to the end of the file"
(gzip). Pure: reads only file sizes, a CSV's first line and Parquet metadata.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from paramshard.errors import ConfigError
from paramshard.messages.shard_tasks import KINDS, MAX_TASKS, Task  # noqa: F401 - the task itself (shared with server 0)

DEFAULT_TASK_BYTES = 64 << 20


def kind_of(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".gz"):
        return "gzip"
    if name.endswith((".parquet", ".pq")):      # frames.PARQUET_SUFFIXES, without importing pandas
        return "rows"
    return "bytes"


def split_files(paths, task_bytes: int = DEFAULT_TASK_BYTES, header: bool = False) -> list[Task]:
    """The tasks of ``paths`` in file order. ``header``: text files start with a header line
    (a CSV/TSV whose schema says ``format.header``)."""
    if type(task_bytes) is not int or task_bytes < 1:
        raise ConfigError(f"task_bytes={task_bytes!r}: must be a whole number of bytes >= 1")
    tasks: list[Task] = []
    for index, path in enumerate(Path(p) for p in paths):
        kind = kind_of(path)
        if kind == "gzip":
            spans = [(0, -1)]
        elif kind == "rows":
            spans = _row_group_spans(path, task_bytes)
        else:
            spans = byte_spans(path.stat().st_size, _header_end(path) if header else 0, task_bytes)
        for start, end in spans:
            tasks.append(Task(len(tasks), index, start, end, kind))
            if len(tasks) > MAX_TASKS:
                raise ConfigError(f"more than {MAX_TASKS} tasks at task_bytes={task_bytes}: pass a larger "
                                  f"task_bytes")
    return tasks


def byte_spans(size: int, first: int, task_bytes: int) -> list[tuple[int, int]]:
    """[first, size) cut every ``task_bytes``."""
    return [(s, min(s + task_bytes, size)) for s in range(first, size, task_bytes)]


def _header_end(path: Path) -> int:
    """The byte after a text file's first line (0 for an empty file)."""
    with open(path, "rb") as f:
        line = f.readline()
    return len(line)


def _row_group_spans(path: Path, task_bytes: int) -> list[tuple[int, int]]:
    from paramshard.data.readers.frames import open_parquet
    meta = open_parquet(path).metadata
    spans, start, row, size = [], 0, 0, 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        row += group.num_rows
        size += group.total_byte_size
        if size >= task_bytes:
            spans.append((start, row))
            start, size = row, 0
    if row > start:
        spans.append((start, row))
    return spans


def fingerprint(files: list[str], tasks: list[Task]) -> str:
    """Names the task list: every trainer registering an epoch must send the same one."""
    text = json.dumps([files, [t.to_wire() for t in tasks]], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]
