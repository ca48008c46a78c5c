"""One pass over the training data for the statistics a schema's transforms need.

Computed once (``paramshard schema fit``) and written into the schema file, so
every trainer, the evaluation and a served model transform alike; a trainer
never computes statistics from its own shard.

- mean and std (population, as StandardScaler) of each numeric column after
  its stateless transforms: merged chunk by chunk (Chan et al.'s pairwise
  update), exact in float64;
- bucket edges: quantiles of a seeded uniform reservoir sample of each
  column's present values; exact while the data has at most ``RESERVOIR``
  rows, a sample of that size beyond (rank error about 1/sqrt(RESERVOIR));
- per categorical column: rows, missing, distinct values, the most frequent
  ones (for people reading the file) and, with min_count > 1, the vocabulary
  kept (values seen at least min_count times);
- a regression label: its count, mean and std (population), into ``label.stats``:
  the models train on the standardised label (models/heads.py).
"""
from __future__ import annotations

import collections
import dataclasses

import numpy as np

from paramshard.errors import ConfigError
from paramshard.data.readers._reader import as_paths
from paramshard.data.features.encode import as_text, bag_values, missing_mask, parse_numbers, pre_standardize
from paramshard.data.errors import DataFormatError
from paramshard.data.readers.frames import iter_frames
from paramshard.specs.schema import Column, Schema

RESERVOIR = 1 << 20
TOP = 10


class NumericStats:
    def __init__(self, column: Column, seed: int):
        self.column = column
        self.n = self.missing = 0
        self.mean = self.m2 = 0.0
        self.lo, self.hi = np.inf, -np.inf
        self.sample = np.empty(0, np.float64)
        self.seen = 0
        self.rng = np.random.default_rng(seed)

    def update(self, x: np.ndarray, miss: np.ndarray) -> None:
        present = x[~miss & ~np.isnan(x)]
        self.missing += int(miss.sum())
        if not len(present):
            return
        self.lo, self.hi = min(self.lo, present.min()), max(self.hi, present.max())
        v = pre_standardize(self.column, present)
        n, mean, m2 = len(v), float(v.mean()), float(((v - v.mean()) ** 2).sum())
        total = self.n + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.m2 += m2 + delta * delta * self.n * n / total
        self.n = total
        if self.column.bucketize:
            self._reservoir(present)

    def _reservoir(self, values: np.ndarray) -> None:
        room = RESERVOIR - len(self.sample)
        if room > 0:
            self.sample = np.concatenate([self.sample, values[:room]])
            self.seen += min(room, len(values))
            values = values[room:]
        if len(values):   # Algorithm R, vectorised: item number t replaces a random slot with prob RESERVOIR/t
            t = self.seen + 1 + np.arange(len(values))
            slot = (self.rng.random(len(values)) * t).astype(np.int64)
            keep = slot < RESERVOIR
            self.sample[slot[keep]] = values[keep]
            self.seen += len(values)

    def result(self) -> dict:
        out: dict[str, object] = {"count": self.n, "missing": self.missing,
               "mean": self.mean if self.n else 0.0, "std": float(np.sqrt(self.m2 / self.n)) if self.n else 0.0,
               "min": float(self.lo) if self.n else None, "max": float(self.hi) if self.n else None}
        if self.column.bucketize:
            if not len(self.sample):
                raise ConfigError(f"column {self.column.name!r}: no values to compute bucket edges from")
            q = np.quantile(self.sample, np.linspace(0, 1, self.column.bucketize + 1))
            out["edges"] = [float(e) for e in np.unique(q)]
        return out


class CategoryStats:
    def __init__(self, column: Column):
        self.column = column
        self.rows = self.missing = 0
        self.counts: collections.Counter = collections.Counter()

    def update(self, raw: np.ndarray, miss: np.ndarray, missing_tokens: frozenset) -> None:
        self.rows += len(raw)
        self.missing += int(miss.sum())
        text: list[str] | np.ndarray
        if self.column.kind == "multi":
            sep = self.column.separator
            text = [t for v in raw[~miss] for t in bag_values(v, sep) if t not in missing_tokens]
        else:
            text = as_text(raw[~miss])
        if len(text):
            values, counts = np.unique(np.asarray(text, dtype=object), return_counts=True)
            self.counts.update(dict(zip(values, counts.tolist())))

    def result(self) -> dict:
        out = {"count": self.rows, "missing": self.missing, "distinct": len(self.counts),
               "top": [[v, c] for v, c in self.counts.most_common(TOP)]}
        if self.column.min_count > 1:
            out["vocabulary"] = {v: c for v, c in self.counts.items() if c >= self.column.min_count}
        return out


def fit_schema(schema: Schema, paths, skip_bad_lines: bool = False, seed: int = 0) -> Schema:
    """A copy of ``schema`` with every feature column's statistics from ``paths``."""
    missing_tokens = frozenset(schema.format.missing)
    stats = {c.name: (NumericStats(c, seed) if c.kind == "numeric" else CategoryStats(c))
             for c in schema.columns if c.kind != "drop"}
    # A regression label: its mean and std, as a numeric column's without transforms.
    label = NumericStats(Column(schema.label.column), seed) if schema.label_kind == "regression" else None
    rows = 0
    for path in as_paths(paths):
        for frame in iter_frames(path, schema.format, schema.used_columns):
            for line, reason in frame.bad:
                _bad(path, line, reason, skip_bad_lines)
            rows += len(frame)
            for name, acc in stats.items():
                raw = frame.columns[name]
                miss = missing_mask(raw, missing_tokens)
                if isinstance(acc, NumericStats):
                    x, not_number = parse_numbers(raw, miss)
                    for i in np.flatnonzero(not_number)[:1]:
                        _bad(path, int(frame.lines[i]), f"column {name!r} is not a number: {raw[i]!r}",
                             skip_bad_lines)
                    acc.update(x, miss | not_number)
                else:
                    acc.update(raw, miss, missing_tokens)
            if label is not None:
                raw = frame.columns[schema.label.column]
                miss = missing_mask(raw, missing_tokens)
                x, not_number = parse_numbers(raw, miss)
                for i in np.flatnonzero(not_number | miss)[:1]:
                    _bad(path, int(frame.lines[i]), f"label column {schema.label.column!r} is "
                         f"{'missing' if miss[i] else 'not a number: ' + repr(raw[i])}", skip_bad_lines)
                label.update(x, miss | not_number)
    if rows == 0:
        raise ConfigError(f"schema fit: no data rows in {', '.join(map(str, as_paths(paths)))} (an empty file, "
                          f"or a header only): fit on the training files that hold the data")
    columns = [dataclasses.replace(c, stats=stats[c.name].result()) if c.name in stats else c
               for c in schema.columns]
    fitted = dataclasses.replace(schema, columns=columns, rows_fitted=rows)
    if label is not None:
        got = label.result()
        fitted.label = dataclasses.replace(schema.label, stats={k: got[k] for k in ("count", "mean", "std")})
    return fitted


def _bad(path, line: int, reason: str, skip: bool) -> None:
    if not skip:
        raise DataFormatError(path, line, reason, hint="fix or remove the line, or fit with --skip-bad-lines")
