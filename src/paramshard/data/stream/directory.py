"""DirectoryStream: a directory of append-only files as a live event stream (the embedded
default StreamSource; data/stream/source.py is the protocol).

    stream = DirectoryStream("data/live", rank=trainer_id, world=num_trainers)
    batch = stream.poll(512, timeout=1.0)    # StreamBatch(records, position, arrived) or None

**Files.** CSV (the first line is the header; one record a line, no newline inside a field),
JSON lines (one object a line) and Parquet, told apart by suffix (``.csv``; ``.jsonl``,
``.ndjson``, ``.json``; ``.parquet``, ``.pq``) or all of one ``format=``. A CSV or JSON-lines
file may grow: only whole lines are taken, a last line without its newline waits for it. A
Parquet file is complete once it exists under its final name: writers write it under a hidden
name (``.name``, ``_name``) or with ``.tmp``/``.part``/``.inprogress`` and rename it into place,
and those names are never read.

**Order.** At every poll the files are visited in name order and each gives what was appended
since the last read: a file's records in file order, earlier names first, later growth after.

**Which trainer reads a record.** Record j of a file (its j-th data line or row, blank lines
not counted) is rank ``j % world``'s. Why by record index and not by file: the typical live
source is one log file that keeps growing, which must feed every trainer, and a file that
appears later than another with a greater name must not shift any assignment. The rule
depends only on the file's bytes, never on when a trainer reads or how fast, so trainers
reading at different speeds each take a fixed, disjoint share, and every record is read by
exactly one of them. The cost: each reader scans every line (not parses: only its own are
parsed), which is cheap beside training on them.

**Position.** ``position()`` is JSON (data/stream/directory_position.py): per file the bytes
consumed (at a line end) and the records before them, or the rows read of a Parquet file.
``seek`` checks a position whole (a damaged field, a position of another rank or world, or a
file truncated since is a PositionError naming it) and continues exactly after it.
``commit`` has nothing to do: the files are the log, and a position is all a reader needs.

**arrived.** With ``time_column=`` (unix seconds in the records) the batch's oldest event time;
else the oldest modification time of the files read for the batch, as seen when read (an
approximation: a growing file's time is its newest append's).

Every wait is bounded by ``poll``'s ``timeout``.
"""
from __future__ import annotations

import os
import time

import pandas as pd

from paramshard.data.errors import DataFormatError
from paramshard.data.stream import directory_position as positions
from paramshard.data.stream.errors import PositionError
from paramshard.data.stream.source import StreamBatch
from paramshard.data.stream.tail import FileTail
from paramshard.errors import ConfigError
from paramshard.log import get_logger

log = get_logger("data")

SUFFIXES = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".parquet": "parquet",
            ".pq": "parquet"}
FORMATS = ("csv", "jsonl", "parquet")
UNFINISHED = (".tmp", ".part", ".inprogress", ".crc")      # names a writer has not renamed into place yet
POLL_INTERVAL = 0.05        # seconds between looks at the directory while nothing new is there


class DirectoryStream:
    def __init__(self, root, rank: int = 0, world: int = 1, format: str | None = None, time_column: str | None = None,
                 delimiter: str = ",", poll_interval: float = POLL_INTERVAL):
        if not isinstance(world, int) or world < 1 or not isinstance(rank, int) or not 0 <= rank < world:
            raise ConfigError(f"DirectoryStream: rank {rank!r} of world {world!r}: needs 0 <= rank < world")
        if format is not None and format not in FORMATS:
            raise ConfigError(f"DirectoryStream: format {format!r} is not one of {', '.join(FORMATS)} (or None: "
                              f"by each file's suffix)")
        self.root = os.fspath(root)
        if not os.path.isdir(self.root):
            raise ConfigError(f"stream directory {self.root} does not exist (or is not a directory): create it, "
                              f"and have the writers append files into it")
        self.rank, self.world, self.format = rank, world, format
        self.time_column, self.delimiter, self.poll_interval = time_column, delimiter, poll_interval
        self._files: dict[str, FileTail] = {}
        self._ignored: set[str] = set()
        self._closed = False

    # -- the protocol ---------------------------------------------------------------------
    def poll(self, max_records: int, timeout: float) -> StreamBatch | None:
        if self._closed:
            raise ConfigError(f"DirectoryStream({self.root}).poll after close()")
        if max_records < 1:
            raise ConfigError(f"poll(max_records={max_records}): needs at least 1")
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            batch = self._take(max_records)
            left = deadline - time.monotonic()
            if batch is not None or left <= 0:
                return batch
            time.sleep(min(self.poll_interval, left))

    def position(self) -> dict:
        return {"source": positions.SOURCE, "version": positions.VERSION, "rank": self.rank, "world": self.world,
                "files": {name: tail.entry() for name, tail in sorted(self._files.items())}}

    def seek(self, position: dict) -> None:
        entries = positions.check(position, self.rank, self.world)
        tails = {}
        for name, entry in entries.items():
            path = os.path.join(self.root, name)
            kind = self._kind(name)
            if kind is None:
                raise PositionError(f"position files[{name!r}]: not a stream file of {self.root} (a hidden, unfinished "
                                    f"or unknown kind of name)")
            if os.path.exists(path):
                positions.check_against_file(name, entry, path, kind)
            # A named file that is gone was read and removed (retention): it stays named, read.
            tails[name] = FileTail(path, kind, entry.get("bytes", 0), entry["records"], self.delimiter)
        self._files = tails

    def commit(self, position: dict) -> None:
        """Nothing to do: the files are the log, a position is all a reader needs."""

    def close(self) -> None:
        self._closed = True
        for tail in self._files.values():
            tail.forget_rows()

    # -- reading ---------------------------------------------------------------------------
    def _take(self, wanted: int) -> StreamBatch | None:
        before = {name: (t.offset, t.records) for name, t in self._files.items()}
        try:
            return self._take_from_files(wanted)
        except BaseException:
            # Nothing of a failed poll is taken: the position stays before the records it read.
            for name in list(self._files):
                if name in before:
                    self._files[name].offset, self._files[name].records = before[name]
                else:
                    del self._files[name]
            raise

    def _take_from_files(self, wanted: int) -> StreamBatch | None:
        frames, mtimes = [], []
        for name, size, kind in self._names():
            tail = self._files.get(name)
            if tail is None:
                tail = self._files[name] = FileTail(os.path.join(self.root, name), kind, delimiter=self.delimiter)
            if not tail.has_news(size):
                continue
            while wanted > 0:
                take = tail.take(wanted, self.rank, self.world)
                if take is None:
                    break
                tail.move(take)
                if take.frame is not None:
                    frames.append(take.frame)
                    mtimes.append(take.mtime)
                    wanted -= len(take.frame)
                elif tail.kind == "parquet":
                    break
            if wanted == 0:
                break
        if not frames:
            return None
        records = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
        return StreamBatch(records, self.position(), self._arrived(records, mtimes))

    def _names(self) -> list[tuple[str, int, str]]:
        """(name, size, kind) of the stream's files now, in name order (those a writer has not
        finished are left out)."""
        found = []
        try:
            for entry in os.scandir(self.root):
                kind = self._kind(entry.name) if entry.is_file() else None
                if kind is not None:
                    try:
                        found.append((entry.name, entry.stat().st_size, kind))
                    except FileNotFoundError:
                        continue        # removed since it was listed
        except OSError as exc:
            raise DataFormatError(self.root, None, f"the stream directory cannot be listed: {exc}", hint=None) from None
        return sorted(found)

    def _kind(self, name: str) -> str | None:
        if name[:1] in (".", "_") or name.endswith(UNFINISHED):
            return None
        if self.format is not None:
            return self.format
        kind = SUFFIXES.get(os.path.splitext(name)[1].lower())
        if kind is None and name not in self._ignored:
            self._ignored.add(name)
            log.warning("stream directory %s: %s is not read (suffix not one of %s; or pass format=)", self.root,
                        name, ", ".join(SUFFIXES))
        return kind

    def _arrived(self, records: pd.DataFrame, mtimes: list[float]) -> float | None:
        if self.time_column is not None and self.time_column in records:
            times = pd.to_numeric(records[self.time_column], errors="coerce")
            if times.notna().any():
                return float(times.min())
        return min(mtimes) if mtimes else None
