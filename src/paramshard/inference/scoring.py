"""`paramshard predict`: a model file scores the rows of CSV, TSV or Parquet files, no code.

The file's recorded model (specs/model_spec.py) says which module to build and its
fitted schema how to encode a row, exactly as training encoded it
(data/features/encode.py). Each input row gets one score, the probability
``sigmoid(logit)``, in input order, files in the order given; a regression model's
score is the predicted value in the label's units, and a multi-task model writes one
probability per label, columns ``score_<label>`` (models/heads.py). The label column
may be absent (data to score); when every file has it (every label's, multi-task),
the labels are written next to the scores (``label``; ``label_<label>``) and AUC /
log loss (a regression: MSE, RMSE, MAE; multi-task: per label) are computed. ``keep`` columns (an id, a key
to join on) are copied from the input into the scores file before the score, row for
row. Input with no rows at all is an error: a scores file of no rows is never the
answer to a question.

Every row must encode: a bad line is an error naming ``path:line`` (a skipped
line would shift every score after it onto the wrong row). Files are streamed:
one chunk and one batch in memory at a time, scores written as they come.
"""
from __future__ import annotations

import csv
import sys
from typing import Any
from pathlib import Path

import numpy as np

from paramshard.data.readers._reader import MAX_LINE_BYTES, as_paths, iter_chunks
from paramshard.data.features.encode import Encoder
from paramshard.data.features.names import did_you_mean
from paramshard.data.errors import DataFormatError
from paramshard.data.readers.frames import delimiter_hint, file_format, iter_frames, with_delimiter
from paramshard.data.label_metrics import metrics_for
from paramshard.models.heads import LabelHead, head_of
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


def column_names(path: Path, schema: Schema) -> list[str]:
    """The file's columns (its header, Parquet schema or format.names); [] for an empty file."""
    kind, delimiter = file_format(path, schema.format)
    if kind == "parquet":
        import pyarrow.parquet as pq
        return list(pq.ParquetFile(path).schema_arrow.names)
    if not schema.format.header:
        return list(schema.format.names)
    for _, chunk in iter_chunks(path, 1 << 16, MAX_LINE_BYTES):
        header = chunk[:chunk.index(b"\n")].decode("utf-8", "replace")
        return [n.strip() for n in next(csv.reader([header], delimiter=delimiter))]
    return []           # an empty file: no rows, no columns


def has_label(path: Path, schema: Schema) -> bool:
    """Whether the file has the schema's label column (every label's, multi-task)."""
    names = column_names(path, schema)
    return all(label in names for label in schema.label_names)


def output_columns(head: LabelHead, with_labels: bool) -> tuple[list[str], list[str]]:
    """(score columns, label columns) of the scores file: "score" and "label", or per task
    "score_<label>" and "label_<label>"."""
    if head.kind == "multitask":
        return [f"score_{n}" for n in head.names], [f"label_{n}" for n in head.names] if with_labels else []
    return ["score"], ["label"] if with_labels else []


def check_keep(paths, schema: Schema, keep, with_labels: bool, head: LabelHead | None = None) -> list[str]:
    """The --keep columns, each once, checked against every file's columns before any score
    is written (a missing one in the third file must not leave two files' scores behind)."""
    keep = list(dict.fromkeys(keep or ()))
    scores, labels = output_columns(head or LabelHead(), with_labels)
    taken = scores + labels
    for name in keep:
        if name in taken:
            raise ConfigError(f"--keep {name}: the scores file has a column {name!r} of its own; keep another "
                              f"column, or rename this one in the input")
    for path in paths:
        names = column_names(path, schema)
        missing = [name for name in keep if name not in names]
        if missing:
            raise ConfigError(f"--keep {missing[0]}: {path} has no column {missing[0]!r}"
                              f"{did_you_mean(missing[0], names)} (its columns: {', '.join(names) or 'none'})"
                              f"{delimiter_hint(names, file_format(path, schema.format)[1])}")
    return keep


def batches(paths, schema: Schema, with_labels: bool, batch_size: int, keep=()):
    """(TabularBatch of at most ``batch_size`` rows, {kept column: its values for those rows}),
    every row of ``paths`` in order."""
    encoder = Encoder(schema, labels=with_labels)
    wanted = [c for c in schema.used_columns if with_labels or c != schema.label.column]
    wanted += [c for c in keep if c not in wanted]
    for path in paths:
        for frame in iter_frames(path, schema.format, wanted):
            batch, bad = encoder.encode(frame.columns)
            problems = list(frame.bad) + [(int(frame.lines[row]), reason) for row, reason in bad]
            if problems:
                line, reason = min(problems)
                raise DataFormatError(path, line, reason, hint=HINT)
            # Every row encoded (a bad one raised above): the batch's rows are the frame's.
            for start in range(0, len(batch), batch_size):
                end = min(start + batch_size, len(batch))
                yield batch.take(start, end), {c: frame.columns[c][start:end] for c in keep}


class ScoreWriter:
    """Scores (and labels) as CSV/TSV/Parquet by ``out``'s extension (None: CSV)."""

    def __init__(self, out, with_labels: bool, keep=(), head: LabelHead | None = None):
        self.with_labels, self.keep, self.rows = with_labels, list(keep), 0
        self.head = head or LabelHead()
        self.score_names, self.label_names = output_columns(self.head, with_labels)
        self.out = Path(out) if out is not None else None
        self.kind = "csv"
        if self.out is not None:
            kind = OUTPUTS.get(self.out.suffix.lower())
            if kind is None:
                raise ConfigError(f"--out {self.out}: write .csv, .tsv, .parquet or .pq")
            self.kind = kind
            if not self.out.parent.is_dir():
                raise ConfigError(f"--out {self.out}: directory {self.out.parent} does not exist")
        self._parquet: Any = None       # pyarrow's ParquetWriter (pyarrow has no types), made by the first write
        self._file = None

    def _frame(self, scores: np.ndarray, labels: np.ndarray, kept: dict):
        import pandas as pd
        columns = {name: kept[name] for name in self.keep}
        scores, labels = scores.reshape(len(scores), -1), labels.reshape(len(labels), -1)
        for t, name in enumerate(self.score_names):
            columns[name] = scores[:, t]
        for t, name in enumerate(self.label_names):
            # A regression's label is the number itself; a binary one 0/1.
            columns[name] = labels[:, t] if self.head.kind == "regression" else labels[:, t].astype(np.int8)
        return pd.DataFrame(columns)

    def write(self, file, scores: np.ndarray, labels: np.ndarray, kept: dict) -> None:
        frame = self._frame(scores, labels, kept)
        if self.kind == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq
            table = pa.Table.from_pandas(frame, preserve_index=False)
            if self._parquet is None:
                self._parquet = pq.ParquetWriter(file, table.schema)
            elif not table.schema.equals(self._parquet.schema):
                # A kept column read as text from a CSV and typed from a Parquet file: the first file's type.
                try:
                    table = table.cast(self._parquet.schema)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise ConfigError(f"--keep {', '.join(self.keep)}: the values have another type here than in an "
                                      f"earlier file ({exc}): write .csv, or predict the files separately") from None
            self._parquet.write_table(table)
        else:
            # pandas writes a float64 as its shortest repr: read back, it is the same number.
            frame.to_csv(file, index=False, header=self.rows == 0, sep="\t" if self.kind == "tsv" else ",")
        self.rows += len(scores)

    def close(self, file) -> None:
        if self._parquet is not None:
            self._parquet.close()


def predict_files(model_path, data, out=None, batch_size: int = 8192, stream=None, keep=(), delimiter=None) -> dict:
    """Score every row of ``data`` with the model file ``model_path`` into ``out`` (None:
    CSV on ``stream``, default stdout), each row's ``keep`` columns before its score;
    ``delimiter`` (--delimiter) overrides the one the schema records.
    Returns {"rows", "labels"} and, with labels, "auc", "logloss", "accuracy" (a regression
    model: "mse", "rmse", "mae"; multi-task: the means and "tasks", each label's)."""
    from paramshard.inference.serving import build_from_file

    if batch_size < 1:
        raise ConfigError(f"--batch-size {batch_size}: must be >= 1")
    paths = as_paths(data)
    model = build_from_file(model_path)
    schema = schema_of(model, model_path)
    schema.format = with_delimiter(schema.format, delimiter)
    labelled = [has_label(p, schema) for p in paths]
    if any(labelled) and not all(labelled):
        raise ConfigError(f"{paths[labelled.index(False)]} has no label column {', '.join(map(repr, schema.label_names))} and "
                          f"{paths[labelled.index(True)]} has one: predict them separately")
    with_labels = bool(labelled) and all(labelled)
    head = head_of(model)
    keep = check_keep(paths, schema, keep, with_labels, head)
    writer = ScoreWriter(out, with_labels, keep, head)
    metrics = metrics_for(head.kind, head.names)

    def score(file):
        for batch, kept in batches(paths, schema, with_labels, batch_size, keep):
            scores = predict(model, [batch])
            if with_labels:
                metrics.update(batch.labels, scores)
            writer.write(file, scores, batch.labels, kept)
        if writer.rows == 0:
            # Nothing written yet: --out is not replaced, stdout gets nothing.
            raise ConfigError(f"no rows to score in {', '.join(map(str, paths))}: "
                              f"{'the file is' if len(paths) == 1 else 'the files are'} empty or hold a header only")
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

