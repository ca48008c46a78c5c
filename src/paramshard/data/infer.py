"""A first schema from a look at a file's first rows (``paramshard schema infer``).

The guesses, each written into the column's ``note`` so the user can see why
and edit the file:
- a column whose present values all parse as numbers is numeric:
  "standardize", preceded by "log" when it is heavy-tailed (skewness > 2, as
  counts and amounts are), a missing indicator when any value is missing,
  and 10 quantile buckets as one more id field when it has more than 10
  distinct values;
- anything else is categorical, or multi-valued when most of its cells hold
  one of the usual list separators (``|``, ``;``);
- a column with a single value in the sample (always empty padding fields)
  is dropped: it can only become a constant;
- the label is --label, else a column named like one (label, click, target,
  y, ...); a text label with two values maps the rarer one to 1.
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ._reader import as_paths, read_blocks
from .encode import as_text, missing_mask, parse_numbers
from .frames import file_format, iter_frames
from .schema import DEFAULT_MISSING, Column, Format, Label, Schema

SAMPLE_ROWS = 20000
LABEL_NAMES = ("label", "click", "clicked", "target", "y", "is_click", "income", "class", "outcome")
MULTI_SEPARATORS = ("|", ";")
SKEWED = 2.0
# Numbers also become quantile-bucket ids, so the model can learn a shape per range (an age
# effect that rises then falls) that one linear weight cannot; the standardized value stays.
BUCKETS = 10


def sniff_format(path: Path) -> Format:
    kind, delimiter = file_format(path, Format())
    if kind == "parquet":
        return Format(type="parquet", header=True)
    head = next(read_blocks(path, 1 << 16), b"").decode("utf-8", "replace")
    lines = [ln for ln in head.splitlines()[:50] if ln]
    if not lines:
        raise ConfigError(f"{path}: empty file, nothing to infer a schema from")
    if not path.name.lower().removesuffix(".gz").endswith((".csv", ".tsv")):
        delimiter = "\t" if lines[0].count("\t") >= max(1, lines[0].count(",")) else ","
    rows = list(csv.reader(lines, delimiter=delimiter))
    header = _looks_like_header(rows)
    names = [] if header else [f"c{i}" for i in range(len(rows[0]))]
    return Format(type="tsv" if delimiter == "\t" else "csv", delimiter=delimiter, header=header, names=names)


def _looks_like_header(rows: list[list[str]]) -> bool:
    """A header names columns: none of its cells is a number, and below it some
    column is numeric or its first cell appears nowhere else in that column."""
    first, rest = rows[0], rows[1:]
    if any(_is_number(v) for v in first):
        return False
    for i, name in enumerate(first):
        below = [r[i] for r in rest if i < len(r)]
        if below and (all(_is_number(v) or v.strip() in DEFAULT_MISSING for v in below) or name not in below):
            return True
    return not rest


def _is_number(v: str) -> bool:
    try:
        float(v)
        return True
    except ValueError:
        return False


def infer_schema(path, label: str | None = None, sample_rows: int = SAMPLE_ROWS) -> Schema:
    path = as_paths(path)[0]
    fmt = sniff_format(path)
    names = _names(path, fmt)
    columns, taken = {n: [] for n in names}, 0
    for frame in iter_frames(path, fmt, names):
        for n in names:
            columns[n].append(frame.columns[n])
        taken += len(frame)
        if taken >= sample_rows:
            break
    sample = {n: np.concatenate(v)[:sample_rows] if v else np.empty(0, object) for n, v in columns.items()}
    label = label or next((n for n in names if n.lower() in LABEL_NAMES), None)
    if label is None or label not in names:
        what = f"no column {label!r}" if label else "no column looks like the label"
        raise ConfigError(f"{path}: {what}; pass --label COLUMN (columns: {', '.join(names)})")
    missing = frozenset(fmt.missing)
    return Schema(label=_label(label, sample[label], missing),
                  columns=[_column(n, sample[n], missing) for n in names if n != label], format=fmt)


def _names(path: Path, fmt: Format) -> list[str]:
    if fmt.names:
        return list(fmt.names)
    if fmt.type == "parquet":
        import pyarrow.parquet as pq
        return list(pq.ParquetFile(path).schema_arrow.names)
    head = next(read_blocks(path, 1 << 16)).decode("utf-8", "replace").splitlines()[0]
    return [n.strip() for n in next(csv.reader([head], delimiter=fmt.delimiter))]


def _label(name: str, raw: np.ndarray, missing: frozenset) -> Label:
    miss = missing_mask(raw, missing)
    x, not_number = parse_numbers(raw, miss)
    if not not_number.any():
        return Label(column=name)
    values, counts = np.unique(as_text(raw[~miss]), return_counts=True)
    if len(values) != 2:
        raise ConfigError(f"label column {name!r} has {len(values)} distinct values in the first rows "
                          f"({', '.join(map(str, values[:5]))}...): a binary label needs two (or numbers); "
                          f"edit label.positive / label.negative in the schema")
    rare = int(np.argmin(counts))
    return Label(column=name, positive=[str(values[rare])], negative=[str(values[1 - rare])])


def _column(name: str, raw: np.ndarray, missing: frozenset) -> Column:
    miss = missing_mask(raw, missing)
    present = raw[~miss]
    if len(np.unique(as_text(present))) <= 1:
        return Column(name, kind="drop", note="one value (or none) in the sample: it would be a constant")
    x, not_number = parse_numbers(raw, miss)
    if not not_number.any():
        v = x[~miss]
        skew = _skewness(v)
        transforms = ["log", "standardize"] if skew > SKEWED else ["standardize"]
        distinct = len(np.unique(v))
        buckets = BUCKETS if distinct > BUCKETS else 0
        return Column(name, "numeric", transforms=transforms, missing_indicator=bool(miss.any()), bucketize=buckets,
                      note=f"numbers; skewness {skew:.1f}" + (" (heavy tail: log first)" if skew > SKEWED else "")
                      + (f"; {distinct} distinct values: also {BUCKETS} quantile buckets as an id field"
                         if buckets else ""))
    text = as_text(present)
    for sep in MULTI_SEPARATORS:
        if np.mean([sep in t for t in text]) > 0.5:
            return Column(name, "multi", separator=sep, note=f"most cells hold several values split by {sep!r}")
    distinct = len(np.unique(text))
    return Column(name, "categorical", note=f"text; {distinct} distinct values in {len(raw)} sampled rows")


def _skewness(v: np.ndarray) -> float:
    std = v.std()
    return float(((v - v.mean()) ** 3).mean() / std ** 3) if std > 0 else 0.0
