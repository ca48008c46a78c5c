"""TabularReader: batches from CSV, TSV and Parquet files, as a schema says.

    schema = Schema.load("adult.fitted.json")
    reader = TabularReader(["train.csv"], schema, batch_size=512, shard=(trainer_id, num_trainers),
                           shuffle=True, equal_steps=True)
    for epoch in range(3):
        for batch in reader:            # a new pass each time, reshuffled
            out = model(**batch.torch()) ...

Streaming: one chunk of a file is held at a time, plus the shuffle buffer.
- ``shard=(i, n)``: this trainer takes records i, i+n, i+2n, ... of the files
  read in order (counting bad lines too, so every trainer agrees who owns
  what without talking);
- ``shuffle``: rows go through a buffer of ``shuffle_buffer`` rows that is
  permuted before it is handed out; the permutation is seeded by (seed, pass,
  shard), so a run is reproducible and each pass differs;
- ``drop_last``: no short final batch;
- ``holdout``: only one part of a held-out split (data/shards/holdout.py): the
  training rows (``part="rest"``) or the validation rows (``part="held"``),
  chosen per record before the shards are dealt (``by="content"``: by a hash of the
  row's fields, which ``read_task`` applies too: DynamicShards jobs);
- ``side``: columns carried beside the features (data/features/side_columns.py: a sample
  weight, a group key), read too and handed out as each batch's ``extras``;
- ``equal_steps``: every shard yields the same number of batches,
  (records // n) // batch_size, counted up front from the files (line counts,
  Parquet metadata; with a holdout, the smallest shard's share of its part),
  so sync trainers take the same number of steps; a shard left short by
  skipped bad lines reads its first rows again to fill up.
Bad lines raise ``DataFormatError`` (``path:line: reason``), or with
``skip_bad_lines=True`` are counted in ``bad_lines`` (examples in
``bad_line_examples``).
"""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from paramshard.errors import ConfigError
from paramshard.log import get_logger
from paramshard.data.readers._reader import DEFAULT_CHUNK_BYTES, MAX_EXAMPLES, as_paths, read_blocks, rebatch
from paramshard.data.features.batch import TabularBatch
from paramshard.data.features.encode import Encoder
from paramshard.data.errors import DataFormatError
from paramshard.data.readers.frames import file_format, iter_frames, open_parquet
from paramshard.data.shards.holdout import Holdout
from paramshard.specs.schema import Schema

log = get_logger("data")
DEFAULT_SHUFFLE_BUFFER = 1 << 16
LIBSVM_ROWS = 8192            # rows per LibsvmReader batch in the libsvm preset


class TabularReader:
    def __init__(self, paths, schema: Schema | str | Path, batch_size: int, *, shard: tuple[int, int] | None = None,
                 shuffle: bool = False, shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER, seed: int = 0,
                 drop_last: bool = False, equal_steps: bool = False, skip_bad_lines: bool = False,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, holdout: Holdout | None = None, side=None):
        if batch_size < 1:
            raise ConfigError(f"batch_size={batch_size}: must be >= 1")
        if shuffle and shuffle_buffer < 1:
            raise ConfigError(f"shuffle_buffer={shuffle_buffer}: must be >= 1")
        self.paths = as_paths(paths)
        self.schema = schema if isinstance(schema, Schema) else Schema.load(schema)
        self.encoder = Encoder(self.schema, side=side)
        # The schema's columns, then the side columns it does not use (a weight is no feature).
        used = self.schema.used_columns
        self.columns_read = used + [n for n in (side.names if side else []) if n not in used]
        self.batch_size = batch_size
        self.shard = _check_shard(shard)
        self.shuffle, self.shuffle_buffer, self.seed = shuffle, shuffle_buffer, seed
        self.drop_last, self.skip_bad_lines, self.chunk_bytes = drop_last, skip_bad_lines, chunk_bytes
        self.holdout = holdout
        if holdout is not None and holdout.by == "content" and self.schema.format.type == "libsvm":
            raise ConfigError("a hold-out by content hashes CSV/TSV/Parquet fields; the libsvm preset has none: "
                              "give validation files instead (the CTR app: --valid)")
        self.steps = None
        if equal_steps:
            index, count = self.shard
            total = count_records(self.paths, self.schema)
            if total == 0:
                raise ConfigError(f"{', '.join(map(str, self.paths))}: no data rows (an empty file, or a header "
                                  f"only): nothing to train on")
            smallest = total // count if holdout is None else int(holdout.per_shard(total, count).min())
            self.steps = smallest // batch_size
            if self.steps == 0:
                what = f"{total} rows" if holdout is None else f"{smallest} rows in the smallest shard of {total}"
                raise ConfigError(f"equal_steps: {what} over {count} trainers make no full batch of "
                                  f"{batch_size}: use a smaller --batch-size")
        self.epoch = -1
        self.batches = 0
        self.bad_lines = 0
        self.bad_line_examples: list[str] = []
        self._skip = 0

    def __len__(self) -> int:
        """Batches per pass, when known (equal_steps)."""
        if self.steps is None:
            raise TypeError("the number of batches is known up front only with equal_steps=True")
        return self.steps

    # -- position, for checkpoints --------------------------------------------
    def state(self) -> dict:
        return {"epoch": self.epoch, "batches": self.batches}

    def restore(self, state: dict) -> None:
        """The next pass is the saved one, from the batch after the saved position."""
        try:
            self.epoch, self._skip = int(state["epoch"]) - 1, int(state["batches"])
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"reader state {state!r}: expected {{'epoch': int, 'batches': int}}") from None

    def read_task(self, task):
        """(batch, position of the next unread record) over one shard task's records
        (data/shards/tasks.py; ``task.file`` indexes ``paths``), read directly from its range;
        ``shard``, ``shuffle`` and ``equal_steps`` do not apply (the shard service deals the
        data: paramshard.data.DynamicShards); a ``holdout`` must be ``by="content"`` (a task
        does not know its records' numbers)."""
        from paramshard.data.readers.tabular_ranges import task_batches
        if self.holdout is not None and self.holdout.by != "content":
            raise ConfigError("read_task: a hold-out by record number cannot be applied to a task's range (it "
                              "does not know its records' numbers): use Holdout(..., by=\"content\")")
        return task_batches(self, task)

    # -- iteration ---------------------------------------------------------------
    def __iter__(self):
        self.epoch += 1
        self.bad_lines, self.bad_line_examples = 0, []
        skip, self._skip = self._skip, 0
        return self._counted(skip)

    def _counted(self, skip: int):
        self.batches = 0
        for batch in self._batches():
            self.batches += 1
            if self.batches > skip:
                yield batch

    def _batches(self):
        if self.steps is not None:
            yield from self._exactly(self.steps)
            return
        for batch in rebatch(self._pass(), self.batch_size, TabularBatch.concat):
            if self.drop_last and len(batch) < self.batch_size:
                return
            yield batch

    def _pass(self):
        rows = self._rows()
        return self._shuffled(rows) if self.shuffle else rows

    def _exactly(self, steps: int):
        """``steps`` full batches: stop early, or go on into the shard again when it ran
        short (its last rows carried over, so no row is dropped before one is repeated)."""
        done = 0
        carried: list[TabularBatch] = []
        while True:
            rows_before = sum(len(b) for b in carried)
            batches = rebatch(itertools.chain(carried, self._pass()), self.batch_size, TabularBatch.concat)
            carried, grew = [], False
            for batch in batches:
                if len(batch) < self.batch_size:
                    carried, grew = [batch], len(batch) > rows_before
                    break
                yield batch
                done, grew = done + 1, True
                if done == steps:
                    return
            if not grew:
                raise ConfigError(f"shard {self.shard[0]} of {self.shard[1]}: no good rows in "
                                  f"{', '.join(map(str, self.paths))} to make {steps} batches of {self.batch_size}")
            log.warning("shard %d of %d ran out after %d of %d batches (bad lines skipped): reading its "
                        "rows again so every trainer takes %d steps", *self.shard, done, steps, steps)

    def _rows(self):
        """Encoded batches of this shard's good rows, in file order (any sizes)."""
        if self.schema.format.type == "libsvm":
            yield from self._libsvm_rows()
            return
        offset = 0
        for path in self.paths:
            base = 2 if file_format(path, self.schema.format)[0] == "text" and self.schema.format.header else 1
            last = offset
            for frame in iter_frames(path, self.schema.format, self.columns_read, self.chunk_bytes):
                records = frame.lines - base + offset
                mine = self._mine(records, frame.columns)
                if len(frame):
                    last = max(last, int(records[-1]) + 1)
                if frame.bad:
                    last = max(last, frame.bad[-1][0] - base + offset + 1)
                batch, bad = self.encoder.encode({name: values[mine] for name, values in frame.columns.items()})
                lines = frame.lines[mine]
                problems = [(line, reason) for line, reason in frame.bad
                            if self._mine(np.array([line - base + offset]))[0]]
                problems += [(int(lines[row]), reason) for row, reason in bad]
                for line, reason in sorted(problems):      # the first bad line of the file is the one raised
                    self._bad(path, line, reason)
                if len(batch):
                    yield batch
            offset = last

    def _libsvm_rows(self):
        """The libsvm preset: LibsvmReader parses (its numpy fast path and its errors), each
        row's features become one bag weighted by their values. Shards by good row."""
        from paramshard.data.readers.libsvm import LibsvmReader
        reader = LibsvmReader(self.paths, LIBSVM_ROWS, skip_bad_lines=self.skip_bad_lines, format="libsvm")
        seen = 0
        try:
            for sb in reader:
                batch = TabularBatch(sb.labels, np.zeros((len(sb), 0), np.float32), sb.ids.view(np.int64), 1,
                                     sb.offsets[:-1].copy(), sb.values)
                mine = np.flatnonzero(self._mine(seen + np.arange(len(sb))))
                seen += len(sb)
                if len(mine):
                    yield batch if len(mine) == len(sb) else batch.select(mine)
        finally:
            self.bad_lines += reader.bad_lines
            self.bad_line_examples += reader.bad_line_examples[:MAX_EXAMPLES - len(self.bad_line_examples)]

    def _mine(self, records: np.ndarray, columns: dict | None = None) -> np.ndarray:
        """Which of these record numbers this reader reads: its shard's, of its holdout part
        (a hold-out by content: by ``columns``, the rows' fields; a bad line has none and is
        counted by its shard alone)."""
        index, count = self.shard
        mine = records % count == index
        if self.holdout is None:
            return mine
        if self.holdout.by == "content":
            if columns is None:
                return mine
            # Of the schema's columns only: a side column read too does not move the split.
            return mine & self.holdout.rows_mask({k: columns[k] for k in self.schema.used_columns})
        return mine & self.holdout.mask(records)

    def _bad(self, path, line: int, reason: str) -> None:
        err = DataFormatError(path, line, reason)
        if not self.skip_bad_lines:
            raise err
        self.bad_lines += 1
        if len(self.bad_line_examples) < MAX_EXAMPLES:
            self.bad_line_examples.append(err.short)

    def _shuffled(self, batches):
        """Blocks of ``shuffle_buffer`` rows, each permuted: a row moves at most a block."""
        rng = np.random.default_rng([self.seed, max(self.epoch, 0), self.shard[0]])
        for block in rebatch(batches, self.shuffle_buffer, TabularBatch.concat):
            yield block.select(rng.permutation(len(block)))


def _check_shard(shard) -> tuple[int, int]:
    if shard is None:
        return (0, 1)
    try:
        index, count = (int(x) for x in shard)
    except (TypeError, ValueError):
        raise ConfigError(f"shard={shard!r}: expected (index, count)") from None
    if count < 1 or not 0 <= index < count:
        raise ConfigError(f"shard={shard!r}: index must be in 0..count-1")
    return index, count


def count_records(paths, schema: Schema, up_to: int | None = None) -> int:
    """Data rows in the files (bad lines included): newlines for text, metadata for Parquet.
    ``up_to``: stop reading once more than that many are counted (a big file is not read
    through when only "at least N" matters); the result is then some number > up_to."""
    total = 0
    for path in as_paths(paths):
        if up_to is not None and total > up_to:
            break
        if file_format(path, schema.format)[0] == "parquet":
            total += open_parquet(path).metadata.num_rows
            continue
        lines, last = 0, b"\n"
        for block in read_blocks(path, 1 << 22):
            lines += block.count(b"\n")
            last = block[-1:]
            if up_to is not None and total + lines > up_to + 1:
                break
        lines += last != b"\n"                 # a last line without its newline
        total += lines - (1 if schema.format.header and lines else 0)
    return total
