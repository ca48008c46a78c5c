"""TabularReader's reading of one shard task (data/shards/tasks.py): a byte range of a CSV/TSV
file (data/readers/ranges.py), a record range of a .gz one, or a row range of a Parquet file,
each batch followed by the position of the next unread record."""
from __future__ import annotations

from typing import Iterator

import numpy as np

from paramshard.errors import ConfigError
from paramshard.data.readers._reader import MAX_EXAMPLES, open_input
from paramshard.data.errors import DataFormatError
from paramshard.data.readers.frames import _numpy, _positions, _split, file_format, header_names, open_parquet
from paramshard.data.readers.ranges import line_groups
from paramshard.data.shards.tasks import Task


def task_batches(reader, task: Task) -> Iterator[tuple[object, int]]:
    """(TabularBatch, next position) over ``task``'s records, ``reader.batch_size`` at a time."""
    if reader.schema.format.type == "libsvm":
        yield from _libsvm_rows(reader, task)
        return
    path = reader.paths[task.file]
    wanted = reader.columns_read
    if task.kind == "rows":
        yield from _parquet_rows(reader, path, task, wanted)
        return
    fmt = reader.schema.format
    kind, delimiter = file_format(path, fmt)
    if kind != "text":
        raise ConfigError(f"{path}: a {task.kind!r} task of a {kind} file; split the files again")
    names = list(fmt.names)
    if fmt.header:
        with open_input(path) as f:
            names = header_names(f.readline().rstrip(b"\r\n"), delimiter)
    if not names:
        raise ConfigError(f"{path}: the schema says the file has no header but lists no column names "
                          f"(format.names); add them, or set format.header: true")
    positions = _positions(path, names, wanted, delimiter)
    skip = 1 if fmt.header and task.kind == "gzip" else 0       # a .gz task counts the header as a record
    gz_task = task if not skip else task.rest(task.start + skip)
    for chunk, first, next_pos in line_groups(path, gz_task, reader.batch_size, reader.chunk_bytes):
        frame = _split(path, chunk, 1, delimiter, names, positions)
        columns, lines = _held_out(reader, frame.columns, frame.lines)
        batch, bad = reader.encoder.encode(columns)
        problems = list(frame.bad) + [(int(lines[row]), reason) for row, reason in bad]
        unit = "record" if task.kind == "gzip" else "byte"
        for line, reason in sorted(problems):
            _bad(reader, DataFormatError(path, None, f"line {line} of the lines from {unit} {first}: {reason}"))
        yield batch, next_pos - skip


def _libsvm_rows(reader, task: Task):
    """The libsvm preset, as TabularReader._libsvm_rows reads it: LibsvmReader parses, each row's
    features become one bag weighted by their values."""
    from paramshard.data.features.batch import TabularBatch
    from paramshard.data.readers.libsvm import LibsvmReader
    lines = LibsvmReader(reader.paths, reader.batch_size, skip_bad_lines=reader.skip_bad_lines, format="libsvm")
    try:
        for sb, position in lines.read_task(task):
            yield TabularBatch(sb.labels, np.zeros((len(sb), 0), np.float32), sb.ids.view(np.int64), 1,
                               sb.offsets[:-1].copy(), sb.values), position
    finally:
        reader.bad_lines += lines.bad_lines
        reader.bad_line_examples += lines.bad_line_examples[:MAX_EXAMPLES - len(reader.bad_line_examples)]


def _parquet_rows(reader, path, task: Task, wanted):
    f = open_parquet(path)
    _positions(path, f.schema_arrow.names, wanted)
    meta = f.metadata
    row = 0
    groups = []
    for g in range(meta.num_row_groups):
        n = meta.row_group(g).num_rows
        if row < task.end and row + n > task.start:
            groups.append((g, row))
        row += n
    for g, first in groups:
        table = f.read_row_group(g, columns=wanted)
        lo, hi = max(task.start - first, 0), min(task.end - first, table.num_rows)
        for s in range(lo, hi, reader.batch_size):
            e = min(s + reader.batch_size, hi)
            part = table.slice(s, e - s)
            columns, rows = _held_out(reader, {name: _numpy(part.column(name)) for name in wanted},
                                      np.arange(s, e))
            batch, bad = reader.encoder.encode(columns)
            for row_index, reason in bad:
                _bad(reader, DataFormatError(path, None, f"row {first + int(rows[row_index]) + 1}: {reason}"))
            yield batch, first + e


def _held_out(reader, columns: dict, lines: np.ndarray):
    """The rows of the reader's hold-out part (a hold-out by content, data/shards/holdout.py; the
    position after a batch still counts every record, kept or not)."""
    if reader.holdout is None:
        return columns, lines
    keep = reader.holdout.rows_mask({k: columns[k] for k in reader.schema.used_columns})   # as TabularReader._mine
    return {name: values[keep] for name, values in columns.items()}, lines[keep]


def _bad(reader, err: DataFormatError) -> None:
    if not reader.skip_bad_lines:
        raise err
    reader.bad_lines += 1
    if len(reader.bad_line_examples) < MAX_EXAMPLES:
        reader.bad_line_examples.append(err.short)

