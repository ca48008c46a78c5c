"""One file of a DirectoryStream: read what was appended since the last read, whole lines only,
keeping this rank's records (record j of the file is rank j % world's; data/stream/directory.py
says why).

A reader's place in a file is (``offset``: bytes consumed, always at a line end; ``records``: the
file's records before it, every rank's). A take computes the new place first and the caller
moves the file's place only once the records parsed, so a bad line leaves the position where it
was. Parquet files are read whole (a Parquet file is complete once it has its final name).
"""
from __future__ import annotations

import dataclasses
import io
import json
import os

from typing import Any

import pandas as pd

from paramshard.data.errors import DataFormatError

CHUNK = 1 << 20            # bytes read at a time from a growing file
BAD_RECORD = "the stream stops before it, its position unmoved: fix the writer, then the file"


@dataclasses.dataclass
class Take:
    frame: pd.DataFrame | None     # this rank's records (None: none)
    offset: int                    # the file's place after them
    records: int
    mtime: float                   # the file's modification time when read


class FileTail:
    def __init__(self, path: str, kind: str, offset: int = 0, records: int = 0, delimiter: str = ","):
        self.path, self.kind, self.delimiter = path, kind, delimiter
        self.offset, self.records = offset, records
        self.header: bytes | None = None      # a CSV file's first line (read again after a seek)
        self._header_end = 0
        self._table: Any = None               # a Parquet file's rows (a pyarrow Table), while some are unread
        self._rows: int | None = None         # a Parquet file's row count, once read

    def has_news(self, size: int) -> bool:
        """Something may have been appended, the file being ``size`` bytes now (a cheap look,
        from the directory listing: a file read out is not opened again)."""
        if self.kind == "parquet":
            return self._rows is None or self.records < self._rows
        return size != self.offset

    def entry(self) -> dict:
        if self.kind == "parquet":
            return {"records": self.records}
        return {"bytes": self.offset, "records": self.records}

    def forget_rows(self) -> None:
        """Drop a Parquet file's rows held in memory (read again if needed)."""
        self._table = None

    def move(self, take: Take) -> None:
        self.offset, self.records = take.offset, take.records
        if self._table is not None and self.records >= self._table.num_rows:
            self._table = None      # read out: a Parquet file does not grow

    def take(self, wanted: int, rank: int, world: int) -> Take | None:
        """Up to ``wanted`` of this rank's records after the file's place; None when no whole
        record was appended since."""
        if self.kind == "parquet":
            return self._take_rows(wanted, rank, world)
        return self._take_lines(wanted, rank, world)

    # -- CSV and JSON lines --------------------------------------------------------------
    def _take_lines(self, wanted: int, rank: int, world: int) -> Take | None:
        with open(self.path, "rb") as f:
            stat = os.fstat(f.fileno())
            if stat.st_size < self.offset:
                raise DataFormatError(self.path, None, f"{stat.st_size} bytes, {self.offset} of them were read already: "
                                      f"the file was truncated or replaced", hint="streamed files are append-only")
            if stat.st_size == self.offset:
                return None
            offset = self.offset
            if self.kind == "csv":
                if self.header is None:
                    line = _first_line(f)
                    if line is None:
                        return None         # the header line is not whole yet
                    self.header, self._header_end = line.rstrip(b"\r\n"), len(line)
                offset = max(offset, self._header_end)
            data = _whole_lines(f, offset, stat.st_size, wanted * world)
        if not data:
            return None
        chosen, records, end = [], self.records, offset
        for line in data.split(b"\n")[:-1]:
            end += len(line) + 1
            if not line.strip():
                continue            # blank lines are no records (the same for every rank)
            if records % world == rank:
                chosen.append((records, end - len(line) - 1, line))
            records += 1
            if len(chosen) == wanted:
                break
        frame = self._parse(chosen) if chosen else None
        return Take(frame, end, records, stat.st_mtime)

    def _parse(self, chosen: list) -> pd.DataFrame:
        if self.kind == "csv":
            body = (self.header or b"") + b"\n" + b"\n".join(line for _, _, line in chosen)
            try:
                return pd.read_csv(io.BytesIO(body), sep=self.delimiter, dtype=object, keep_default_na=False)
            except (ValueError, pd.errors.ParserError) as exc:
                raise DataFormatError(self.path, None, f"records {chosen[0][0]}..{chosen[-1][0]} (bytes from "
                                      f"{chosen[0][1]}) do not parse as CSV with the header's columns: {exc}",
                                      hint=BAD_RECORD) from None
        rows = []
        for index, start, line in chosen:
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise DataFormatError(self.path, None, f"record {index} (byte {start}) is not JSON: {exc}",
                                      hint=BAD_RECORD) from None
            if not isinstance(row, dict):
                raise DataFormatError(self.path, None, f"record {index} (byte {start}) is a JSON "
                                      f"{type(row).__name__}, expected an object (one event a line)", hint=BAD_RECORD)
            rows.append(row)
        return pd.DataFrame.from_records(rows)

    # -- Parquet -------------------------------------------------------------------------
    def _take_rows(self, wanted: int, rank: int, world: int) -> Take | None:
        if self._table is None:
            import pyarrow.parquet as pq       # only a Parquet stream pays for pyarrow
            try:
                self._table = pq.read_table(self.path)
            except (OSError, ValueError) as exc:
                raise DataFormatError(self.path, None, f"not a readable Parquet file ({exc})",
                                      hint="writers write it under a hidden or .tmp name and rename it into place "
                                           "once complete") from None
            self._mtime = os.path.getmtime(self.path)
            self._rows = self._table.num_rows
        total = self._table.num_rows
        if self.records >= total:
            self._table = None
            return None
        first = self.records + (rank - self.records) % world       # this rank's next row
        rows = list(range(first, total, world)[:wanted])
        end = rows[-1] + 1 if len(rows) == wanted else total
        frame = self._table.take(rows).to_pandas() if rows else None
        return Take(frame, 0, end, self._mtime)


def _first_line(f) -> bytes | None:
    f.seek(0)
    line = f.readline()
    return line if line.endswith(b"\n") else None


def _whole_lines(f, offset: int, size: int, lines_wanted: int) -> bytes:
    """The bytes from ``offset`` up to a line end: about ``lines_wanted`` lines' worth (whole
    chunks), more when one line is longer than a chunk; b"" while the last line has no newline."""
    f.seek(offset)
    data = b""
    while offset + len(data) < size:
        data += f.read(min(CHUNK, size - offset - len(data)))
        end = data.rfind(b"\n")
        if end >= 0 and (data.count(b"\n") >= lines_wanted or offset + len(data) >= size):
            return data[:end + 1]
    end = data.rfind(b"\n")
    return data[:end + 1] if end >= 0 else b""
