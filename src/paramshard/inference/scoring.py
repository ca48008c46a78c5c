"""`paramshard predict`: a model file scores the rows of CSV, TSV or Parquet files, no code.

The file's recorded model (specs/model_spec.py) says which module to build and its
fitted schema how to encode a row, exactly as training encoded it
(data/features/encode.py). Each input row gets one score, the probability
``sigmoid(logit)``, in input order, files in the order given. The label column
may be absent (data to score); when every file has it, the labels are written
next to the scores and AUC / log loss are computed.

Every row must encode: a bad line is an error naming ``path:line`` (a skipped
line would shift every score after it onto the wrong row). Files are streamed:
one chunk and one batch in memory at a time, scores written as they come.
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np

from paramshard.data.readers._reader import MAX_LINE_BYTES, as_paths, iter_chunks
from paramshard.data.features.encode import Encoder
from paramshard.data.errors import DataFormatError
from paramshard.data.readers.frames import file_format, iter_frames
from paramshard.data.metrics import BinaryMetrics
from paramshard.specs.schema import Schema
from paramshard.errors import ConfigError
from paramshard.inference.evaluation import predict
from paramshard.export import replaced_into_place

OUTPUTS = {".csv": "csv", ".tsv": "tsv", ".parquet": "parquet", ".pq": "parquet"}
HINT = "predict scores every row: fix or remove the line"


def schema_of(model, path) -> Schema:
    """The fitted schema recorded with the model (ConfigError when there is none)."""
    spec = model.paramshard_spec if hasattr(model, "paramshard_spec") else None
    if not spec or spec.get("schema") is None:
        raise ConfigError(f"{path}: the recorded model has no schema to encode data with (a model built by "
                          f"paramshard.models.build_model from a Schema records one)")
    schema = Schema.from_dict(spec["schema"], where=f"{path}: the recorded schema")
    if schema.format.type == "libsvm":
        raise ConfigError(f"{path}: the model was trained on libsvm files; predict reads CSV, TSV or Parquet")
    return schema


def has_label(path: Path, schema: Schema) -> bool:
    """Whether the file has the schema's label column (its header, Parquet schema or format.names)."""
    kind, delimiter = file_format(path, schema.format)
    if kind == "parquet":
        import pyarrow.parquet as pq
        return schema.label.column in pq.ParquetFile(path).schema_arrow.names
    if not schema.format.header:
        return schema.label.column in schema.format.names
    for _, chunk in iter_chunks(path, 1 << 16, MAX_LINE_BYTES):
        header = chunk[:chunk.index(b"\n")].decode("utf-8", "replace")
        return schema.label.column in [n.strip() for n in next(csv.reader([header], delimiter=delimiter))]
    return False        # an empty file: no rows, no label


def batches(paths, schema: Schema, with_labels: bool, batch_size: int):
    """TabularBatch of at most ``batch_size`` rows, every row of ``paths`` in order."""
    encoder = Encoder(schema, labels=with_labels)
    wanted = [c for c in schema.used_columns if with_labels or c != schema.label.column]
    for path in paths:
        for frame in iter_frames(path, schema.format, wanted):
            batch, bad = encoder.encode(frame.columns)
            problems = list(frame.bad) + [(int(frame.lines[row]), reason) for row, reason in bad]
            if problems:
                line, reason = min(problems)
                raise DataFormatError(path, line, reason, hint=HINT)
            for start in range(0, len(batch), batch_size):
                yield batch.take(start, min(start + batch_size, len(batch)))


class ScoreWriter:
    """Scores (and labels) as CSV/TSV/Parquet by ``out``'s extension (None: CSV)."""

    def __init__(self, out, with_labels: bool):
        self.with_labels, self.rows = with_labels, 0
        self.out = Path(out) if out is not None else None
        self.kind = "csv"
        if self.out is not None:
            self.kind = OUTPUTS.get(self.out.suffix.lower())
            if self.kind is None:
                raise ConfigError(f"--out {self.out}: write .csv, .tsv, .parquet or .pq")
            if not self.out.parent.is_dir():
                raise ConfigError(f"--out {self.out}: directory {self.out.parent} does not exist")
        self._parquet = self._file = None

    def _frame(self, scores: np.ndarray, labels: np.ndarray):
        import pandas as pd
        columns = {"score": scores}
        if self.with_labels:
            columns["label"] = labels.astype(np.int8)
        return pd.DataFrame(columns)

    def write(self, file, scores: np.ndarray, labels: np.ndarray) -> None:
        frame = self._frame(scores, labels)
        if self.kind == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq
            table = pa.Table.from_pandas(frame, preserve_index=False)
            if self._parquet is None:
                self._parquet = pq.ParquetWriter(file, table.schema)
            self._parquet.write_table(table)
        else:
            # pandas writes a float64 as its shortest repr: read back, it is the same number.
            frame.to_csv(file, index=False, header=self.rows == 0, sep="\t" if self.kind == "tsv" else ",")
        self.rows += len(scores)

    def close(self, file) -> None:
        if self._parquet is not None:
            self._parquet.close()
        elif self.rows == 0:          # no rows: still a file with its header (or an empty table)
            self.write(file, np.empty(0), np.empty(0))


def predict_files(model_path, data, out=None, batch_size: int = 8192, stream=None) -> dict:
    """Score every row of ``data`` with the model file ``model_path`` into ``out`` (None:
    CSV on ``stream``, default stdout). Returns {"rows", "labels"} and, with labels,
    "auc", "logloss", "accuracy"."""
    from paramshard.inference.serving import build_from_file

    if batch_size < 1:
        raise ConfigError(f"--batch-size {batch_size}: must be >= 1")
    paths = as_paths(data)
    model = build_from_file(model_path)
    schema = schema_of(model, model_path)
    labelled = [has_label(p, schema) for p in paths]
    if any(labelled) and not all(labelled):
        raise ConfigError(f"{paths[labelled.index(False)]} has no label column {schema.label.column!r} and "
                          f"{paths[labelled.index(True)]} has one: predict them separately")
    with_labels = bool(labelled) and all(labelled)
    writer = ScoreWriter(out, with_labels)
    metrics = BinaryMetrics()

    def score(file):
        for batch in batches(paths, schema, with_labels, batch_size):
            scores = predict(model, [batch])
            if with_labels:
                metrics.update(batch.labels, scores)
            writer.write(file, scores, batch.labels)
        writer.close(file)

    if out is None:
        score(stream or sys.stdout)
    else:
        with replaced_into_place(out) as tmp, open(tmp, "wb" if writer.kind == "parquet" else "w",
                                                   newline="" if writer.kind != "parquet" else None) as file:
            score(file)
    result = {"rows": writer.rows, "labels": with_labels}
    if with_labels:
        result.update(metrics.result())
    return result

