"""Raw columns out of CSV, TSV and Parquet files, in chunks: the one place that
knows file formats. Everything after (encode.py, fit.py, infer.py) sees a
``Frame``: column name -> array of raw values, plus where each row came from.

Text files are read through the line reader (data/readers/_reader.py: chunked, .gz,
CRLF, line-length cap). Fields are counted per line with numpy first; lines
with the wrong count are reported (``path:line: reason``) and the good ones
go through pandas' C parser as strings, so no Python code runs per value.
A chunk with a quote character goes through the csv module instead, which
knows quoted delimiters. One record per line: a quoted field holding a
newline is not supported (CTR data never has one; say so when a line breaks).

The delimiter: ``file_format`` (the schema's, or the suffix's for schemas that
predate recorded delimiters); ``sniff_delimiter`` (what ``schema infer``
records) lets the header decide among ``DELIMITERS``; every "no such column"
error names the likely delimiter when the header reads as one column holding
another one (``delimiter_hint``).

Parquet list columns come out as tuples (one per cell, None when missing), in
the list's order: the multi-valued path (encode.py) takes them as bags.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd

from paramshard.errors import ConfigError
from paramshard.data.readers._reader import DEFAULT_CHUNK_BYTES, MAX_LINE_BYTES, iter_chunks
from paramshard.data.errors import DataFormatError
from paramshard.data.features.names import did_you_mean
from paramshard.specs.schema import Format

PARQUET_SUFFIXES = (".parquet", ".pq")
PARQUET_ROWS = 65536        # rows per record batch read from a Parquet file
DELIMITERS = (",", "\t", ";", "|")      # what the sniffer chooses among, in order of preference
DELIMITER_NAMES = {"tab": "\t", "\\t": "\t", "comma": ",", "semicolon": ";", "pipe": "|"}


@dataclass
class Frame:
    columns: dict            # name -> np.ndarray (object strings for text; typed for Parquet)
    lines: np.ndarray        # int64 1-based line (text) or row (Parquet) number of each row
    bad: list                # [(line, reason)] of rows that could not be split into columns

    def __len__(self) -> int:
        return len(self.lines)


def file_format(path: Path, fmt: Format) -> tuple[str, str]:
    """(kind, delimiter) for one file: Parquet by its suffix or the format's type; a text file's
    delimiter is the format's (``by_suffix`` false, or ';' / '|'), else .tsv a tab and .csv a comma."""
    name = path.name.lower().removesuffix(".gz")
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet", ""
    if fmt.type != "parquet" and (not fmt.by_suffix or fmt.delimiter in (";", "|")):
        return "text", fmt.delimiter
    if name.endswith(".tsv"):
        return "text", "\t"
    if name.endswith(".csv"):
        return "text", ","
    if fmt.type == "parquet":
        return "parquet", ""
    return "text", "\t" if fmt.type == "tsv" else fmt.delimiter


def iter_frames(path: Path, fmt: Format, wanted: list[str], chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[Frame]:
    """Frames holding the ``wanted`` columns of one file, in file order."""
    kind, delimiter = file_format(path, fmt)
    if kind == "parquet":
        yield from _parquet_frames(path, wanted)
    else:
        yield from _text_frames(path, fmt, delimiter, wanted, chunk_bytes, max_line_bytes)


def _text_frames(path, fmt, delimiter, wanted, chunk_bytes, max_line_bytes):
    names = list(fmt.names)
    for first_line, chunk in iter_chunks(path, chunk_bytes, max_line_bytes):
        if first_line == 1 and fmt.header:
            end = chunk.index(b"\n") + 1
            names = header_names(chunk[:end - 1], delimiter)
            chunk, first_line = chunk[end:], 2
        if not names:
            raise ConfigError(f"{path}: the schema says the file has no header but lists no column names "
                              f"(format.names); add them, or set format.header: true")
        positions = _positions(path, names, wanted, delimiter)
        if chunk:
            yield _split(path, chunk, first_line, delimiter, names, positions)


def parse_delimiter(text: str) -> str:
    """A --delimiter value: one character, or tab / \\t / comma / semicolon / pipe."""
    value = DELIMITER_NAMES.get(text.lower(), text)
    if len(value) != 1 or value in "\n\r\"":
        raise ConfigError(f"--delimiter {text!r}: expected one character, e.g. ',' ';' '|' or 'tab'")
    return value


def with_delimiter(fmt: Format, delimiter: str | None) -> Format:
    """``fmt`` read with ``delimiter`` (a --delimiter flag: it wins over the schema's); None: ``fmt``."""
    if not delimiter:
        return fmt
    delimiter = parse_delimiter(delimiter)
    kind = fmt.type if fmt.type in ("parquet", "libsvm") else "tsv" if delimiter == "\t" else "csv"
    return replace(fmt, type=kind, delimiter=delimiter, by_suffix=False)


def sniff_delimiter(lines: list[str]) -> str:
    """The delimiter of a text file's first ``lines`` (header first), among ``DELIMITERS``: the
    header decides which split it into the most columns, among those that split the rows below
    into as many (so a ';'-separated file is not read as one column of ';'-separated bags, nor a
    ','-separated one whose cells hold ';' bags as ';'-separated). Nothing splits the header:
    ','."""
    best, best_key = ",", None
    rows = lines[1:]
    for d in DELIMITERS:
        width = len(next(csv.reader([lines[0]], delimiter=d)))
        if width < 2:
            continue
        agree = sum(len(r) == width for r in csv.reader(rows, delimiter=d)) if rows else 1
        key = (agree / max(len(rows), 1) >= 0.9, width)
        if best_key is None or key > best_key:
            best, best_key = d, key
    return best


def delimiter_hint(names: list[str], delimiter: str) -> str:
    """When the whole header is one name holding another delimiter, the delimiter is wrong: say
    which is likely and how to read the file with it ("" otherwise)."""
    if len(names) != 1:
        return ""
    other = next((d for d in DELIMITERS if d != delimiter and d in names[0]), None)
    if other is None:
        return ""
    flag = "tab" if other == "\t" else other
    return (f" (the header reads as one column: the file looks separated by {other!r}, not {delimiter!r}: "
            f"pass --delimiter '{flag}', or set format.delimiter: {other!r} and format.by_suffix: false "
            f"in the schema)")


def header_names(line: bytes, delimiter: str) -> list[str]:
    """The column names in a header line (CSV quoting understood, spaces around names dropped)."""
    return [n.strip() for n in next(csv.reader([line.decode("utf-8", "replace")], delimiter=delimiter))]


def _positions(path, names: list[str], wanted: list[str], delimiter: str = "") -> list[int]:
    missing = [w for w in wanted if w not in names]
    if missing:
        raise DataFormatError(path, None, f"no column {missing[0]!r}{did_you_mean(missing[0], names)} "
                                          f"(the file has: {', '.join(names)})"
                                          f"{delimiter_hint(names, delimiter) if delimiter else ''}",
                              hint="the schema and the file disagree: check the file, or the schema's "
                                   "format.header / format.names")
    return [names.index(w) for w in wanted]


def _split(path, chunk: bytes, first_line: int, delimiter: str, names: list, positions: list) -> Frame:
    ncols = len(names)
    text = chunk.decode("utf-8", "replace")
    if '"' in text:
        rows = list(csv.reader(text.split("\n")[:-1], delimiter=delimiter))
        counts = np.fromiter((len(r) for r in rows), np.int64, len(rows))
    else:
        a = np.frombuffer(chunk, np.uint8)
        ends = np.flatnonzero(a == ord("\n"))
        line_of = np.cumsum(a == ord("\n")) - (a == ord("\n"))
        counts = np.bincount(line_of[a == ord(delimiter)], minlength=len(ends)) + 1
        rows = None
    good = np.flatnonzero(counts == ncols)
    bad = [(first_line + int(i), f"expected {ncols} columns separated by {delimiter!r}, got {int(counts[i])}"
            + (" (empty line)" if counts[i] == 1 and _is_empty(text, rows, i) else ""))
           for i in np.flatnonzero(counts != ncols)]
    if rows is not None:
        table = np.array([rows[i] for i in good], dtype=object).reshape(len(good), ncols)
        columns = {names[p]: table[:, p] for p in positions}
    elif len(good):
        lines = chunk.split(b"\n")
        body = b"\n".join(lines[i] for i in good) if len(good) < len(counts) else chunk
        df = pd.read_csv(io.BytesIO(body), sep=delimiter, header=None, dtype=object, keep_default_na=False,
                         na_filter=False, quoting=csv.QUOTE_NONE, skip_blank_lines=False, usecols=positions,
                         engine="c")
        columns = {names[p]: df[p].to_numpy(dtype=object) for p in positions}
    else:
        columns = {names[p]: np.empty(0, object) for p in positions}
    return Frame(columns, first_line + good, bad)


def _is_empty(text: str, rows, i: int | np.integer) -> bool:
    return (rows[i] == [] or rows[i] == [""]) if rows is not None else text.split("\n")[i] == ""


def open_parquet(path):
    """A ``pyarrow.parquet.ParquetFile`` (its metadata read: names, row count), or a
    DataFormatError naming the file when it is not Parquet (empty, cut off, mislabelled)."""
    import pyarrow.parquet as pq
    try:
        return pq.ParquetFile(path)
    except Exception as exc:   # noqa: BLE001 - pyarrow raises several kinds for a file that is not Parquet
        raise DataFormatError(path, None, f"is not a readable Parquet file ({exc})", hint=None) from None


def _parquet_frames(path, wanted):
    f = open_parquet(path)
    names = f.schema_arrow.names
    _positions(path, names, wanted)
    row = 1
    for record_batch in f.iter_batches(batch_size=PARQUET_ROWS, columns=wanted):
        n = record_batch.num_rows
        columns = {name: _numpy(record_batch.column(name)) for name in wanted}
        yield Frame(columns, np.arange(row, row + n, dtype=np.int64), [])
        row += n


def _numpy(column) -> np.ndarray:
    """An Arrow column as numpy: numbers stay numbers (nulls NaN), lists become tuples in their
    order (None when missing), everything else object."""
    import pyarrow.types as pat
    if pat.is_list(column.type) or pat.is_large_list(column.type) or pat.is_fixed_size_list(column.type):
        out = np.empty(len(column), dtype=object)
        out[:] = [None if v is None else tuple(v) for v in column.to_pylist()]
        return out
    if pat.is_integer(column.type) or pat.is_floating(column.type) or pat.is_boolean(column.type):
        return column.to_numpy(zero_copy_only=False).astype(np.float64) if column.null_count \
            else column.to_numpy(zero_copy_only=False)
    return np.asarray(column.to_pylist(), dtype=object)
