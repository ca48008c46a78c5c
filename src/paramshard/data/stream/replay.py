"""Events appended to a directory the way a live log grows: the writer side of DirectoryStream.

`paramshard replay DATA --into DIR --rate R` (and the online benchmark) turn a table of records
into a live stream: every ``interval`` seconds the next ``rate * interval`` records are appended
to the current file (CSV and JSON lines grow line by line, flushed whole lines at a time; a
Parquet file is one chunk, written under a dot-name and renamed into place, since a reader can
only take a finished Parquet file), and a new file starts after ``file_rows`` records. File names
sort in the order they were written (``events-000001.csv``, ...), the order DirectoryStream reads.
Each append can be logged (first record's index, count, unix time) so a benchmark knows when
every event became visible.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Callable, Iterator

import pandas as pd

from paramshard.errors import ConfigError

FORMATS = ("csv", "jsonl", "parquet")


@dataclasses.dataclass
class Appended:
    first: int          # index of the first record appended (0-based over the whole replay)
    count: int
    path: Path
    at: float           # unix seconds once the records were visible to a reader


def _chunks(frame: pd.DataFrame, size: int, loops: int) -> Iterator[pd.DataFrame]:
    for _ in range(loops):
        for start in range(0, len(frame), size):
            yield frame.iloc[start:start + size]


class DirectoryAppender:
    """Appends records to ``into`` as growing files of ``fmt``."""

    def __init__(self, into, fmt: str = "csv", file_rows: int = 100_000):
        if fmt not in FORMATS:
            raise ConfigError(f"format {fmt!r}: expected one of {', '.join(FORMATS)}")
        if file_rows < 1:
            raise ConfigError(f"file_rows {file_rows}: must be >= 1")
        self.into, self.fmt, self.file_rows = Path(into), fmt, file_rows
        self.into.mkdir(parents=True, exist_ok=True)
        existing = sorted(self.into.glob(f"events-*.{fmt}"))
        self._file_no = int(existing[-1].stem.split("-")[1]) if existing else 0
        self._rows_in_file = file_rows            # start a new file first: never append to another run's
        self._written = 0

    def _next_file(self) -> Path:
        self._file_no += 1
        self._rows_in_file = 0
        return self.into / f"events-{self._file_no:06d}.{self.fmt}"

    def append(self, records: pd.DataFrame) -> list[Appended]:
        """Append ``records`` (split over files at ``file_rows``); what became visible, and when."""
        done = []
        start = 0
        while start < len(records):
            if self._rows_in_file >= self.file_rows:
                self._next_file()
            path = self.into / f"events-{self._file_no:06d}.{self.fmt}"
            take = records.iloc[start:start + self.file_rows - self._rows_in_file]
            self._write(path, take, fresh=self._rows_in_file == 0)
            done.append(Appended(self._written, len(take), path, time.time()))
            self._rows_in_file += len(take)
            self._written += len(take)
            start += len(take)
        return done

    def _write(self, path: Path, records: pd.DataFrame, fresh: bool) -> None:
        if self.fmt == "parquet":
            # A Parquet file is readable only once whole: one file per chunk, renamed into place.
            self._rows_in_file = self.file_rows          # the next chunk takes a new file
            temporary = path.with_name(f".{path.name}.tmp")
            records.to_parquet(temporary, index=False)
            os.replace(temporary, path)
            return
        if self.fmt == "csv":
            text = records.to_csv(index=False, header=fresh, lineterminator="\n")
        else:
            text = records.to_json(orient="records", lines=True)
            text = text if text.endswith("\n") else text + "\n"
        # One write of whole lines: a reader sees a prefix of them, never half a record it would
        # take (it waits for a line's newline).
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()


def replay(frame: pd.DataFrame, into, rate: float, fmt: str = "csv", file_rows: int = 100_000,
           interval: float = 0.2, loops: int = 1, max_rows: int | None = None,
           on_append: Callable[[Appended], None] | None = None,
           stop: Callable[[], bool] = lambda: False) -> int:
    """Append ``frame``'s records to ``into`` at about ``rate`` records per second (``loops``
    times over, at most ``max_rows``); how many were appended. ``rate`` <= 0: as fast as possible."""
    appender = DirectoryAppender(into, fmt, file_rows)
    per_tick = max(1, int(rate * interval)) if rate > 0 else 10_000
    total, next_at = 0, time.monotonic()
    for chunk in _chunks(frame, per_tick, loops):
        if stop() or (max_rows is not None and total >= max_rows):
            break
        if max_rows is not None:
            chunk = chunk.iloc[:max_rows - total]
        for appended in appender.append(chunk):
            if on_append is not None:
                on_append(appended)
        total += len(chunk)
        if rate > 0:
            next_at += len(chunk) / rate
            time.sleep(max(0.0, next_at - time.monotonic()))
    return total


def append_log_line(appended: Appended) -> str:
    """One JSON line of the replay's log (what a latency benchmark joins on)."""
    return json.dumps({"first": appended.first, "count": appended.count, "file": appended.path.name,
                       "at": round(appended.at, 6)})
