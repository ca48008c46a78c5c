"""Raw columns -> model inputs, as the schema says (a frame in, a TabularBatch out).

Per numeric column: "log" is sign(x) * log1p(|x|) (negatives keep their sign
instead of being clipped), "standardize" uses the fitted mean and std (what
scikit-learn's StandardScaler does: population std, a constant column keeps
std 1). A missing value becomes the fitted mean (0 after standardize; 0
unfitted), so the missing indicator, not the value, tells it apart from 0.
Buckets: the fitted quantile edges, intervals closed on the right as in
``pandas.qcut``; missing values get the field's own id.
Per categorical value: a stable hash of (column, value) (data/features/hashing.py);
values rarer than ``min_count`` in the fitted data share the field's "rare"
id. Multi-valued cells are split on the separator (a Parquet list cell is
its elements) into a bag whose ids each weigh 1/len(bag), so a bag's
embedding is the mean of its values'. A bag keeps the cell's order
(``c|a|b`` gives the ids of c, a, b in that order, repeats kept), and so does
the batch (batch.py): a model over ordered sequences can rely on it. A
behaviour sequence (``sequence_of: CAND``) hashes its values as CAND's
(``feature_id(CAND, value)``), so both columns read the same table rows;
its missing cell keeps its own id ("no history").
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from paramshard.data.features.batch import TabularBatch
from paramshard.data.features.hashing import MISSING_TOKEN, RARE_TOKEN, feature_id, feature_ids
from paramshard.specs.schema import Column, Label, Schema
from paramshard.data.errors import show


def distinct(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(code of each value, distinct values): the per-value work below runs once per
    distinct value (a CTR column has far fewer than rows), the rest is a take."""
    codes, uniques = pd.factorize(values, use_na_sentinel=False)
    return codes, np.asarray(uniques, dtype=object)


def _is_missing(v, missing: frozenset) -> bool:
    return v is None or (isinstance(v, float) and v != v) or (isinstance(v, str) and v.strip() in missing)


def missing_mask(values: np.ndarray, missing: frozenset) -> np.ndarray:
    if values.dtype != object:
        return np.isnan(values) if values.dtype.kind == "f" else np.zeros(len(values), bool)
    codes, uniques = distinct(values)
    return np.fromiter((_is_missing(v, missing) for v in uniques), bool, len(uniques))[codes]


def as_text(values: np.ndarray) -> np.ndarray:
    """Category values as stripped strings (a Parquet number 3 and a CSV "3" agree)."""
    codes, uniques = distinct(values)
    text = np.array([v.strip() if isinstance(v, str) else _number_text(v) for v in uniques.tolist()], dtype=object)
    return text[codes] if len(text) else np.empty(len(values), object)


def _number_text(v) -> str:
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def bag_values(value, separator: str) -> list[str]:
    """The values of one present multi-valued cell, in the cell's order: a list cell's
    elements (Parquet), or text split on ``separator``; stripped, empty ones left out."""
    if isinstance(value, (tuple, list, np.ndarray)):
        items = [v.strip() if isinstance(v, str) else _number_text(v) for v in value if v is not None]
    else:
        items = [t.strip() for t in str(value).split(separator)]
    return [t for t in items if t]


def parse_numbers(values: np.ndarray, missing: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float64 values, NaN where missing; mask of present values that are not numbers)."""
    if values.dtype != object:
        x = values.astype(np.float64)
        return x, np.zeros(len(x), bool)
    codes, uniques = distinct(values)
    parsed = pd.to_numeric(pd.Series(uniques, dtype=object).str.strip(), errors="coerce").to_numpy(np.float64)
    x = parsed[codes] if len(parsed) else np.empty(len(values))
    x[missing] = np.nan
    return x, np.isnan(x) & ~missing


def signed_log(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.log1p(np.abs(x))


def pre_standardize(column: Column, x: np.ndarray) -> np.ndarray:
    """The stateless transforms (those before standardize): what the fitted mean/std describe."""
    return signed_log(x) if "log" in column.transforms else x


def _fitted(column: Column) -> dict:
    """A column's `schema fit` statistics, there whenever it needs them (Encoder checks unfitted())."""
    assert column.stats is not None, f"column {column.name!r} has no statistics"
    return column.stats


class Encoder:
    def __init__(self, schema: Schema, labels: bool = True, side=None):
        """``labels=False``: the columns hold no label column (data to score, `paramshard
        predict`); every batch's labels are NaN. Training reads with labels, always checked.
        ``side``: a SideColumns (data/features/side_columns.py) whose columns each batch carries
        as ``extras`` (a sample weight, a group key), never as features."""
        # A regression label's mean and std are the loss's (models/heads.py), not the encoding's.
        unfitted = [n for n in schema.unfitted() if n not in schema.label_names]
        if unfitted:
            from paramshard.errors import ConfigError
            raise ConfigError(f"schema columns {', '.join(unfitted)} need statistics (standardize, bucketize, "
                              f"min_count): run `paramshard schema fit SCHEMA TRAIN_FILES -o FITTED` and read "
                              f"with the fitted schema")
        self.schema, self.with_labels, self.side = schema, labels, side
        self.missing = frozenset(schema.format.missing)
        self._rare = {c.name: _fitted(c).get("vocabulary") for c in schema.fields if c.kind != "numeric"
                      and c.min_count > 1}

    def encode(self, columns: dict) -> tuple[TabularBatch, list[tuple[int, str]]]:
        """(batch of the good rows, [(row index, reason)] of the bad ones)."""
        s = self.schema
        n = len(columns[s.label.column] if self.with_labels else next(iter(columns.values())))
        bad = np.zeros(n, bool)
        reasons: dict[int, str] = {}

        def flag(mask, reason_of):
            for i in np.flatnonzero(mask & ~bad):
                reasons[int(i)] = reason_of(int(i))
            bad[mask] = True

        labels = self._all_labels(columns, flag, n)
        dense: list[np.ndarray] = []
        bags: list[np.ndarray | list[np.ndarray]] = []    # per field: ids [B], or B bags (TabularBatch.from_bags)
        for c in s.columns:
            if c.kind == "drop":
                continue
            raw = columns[c.name]
            miss = missing_mask(raw, self.missing)
            if c.kind == "numeric":
                x, not_number = parse_numbers(raw, miss)
                flag(not_number, lambda i, c=c, raw=raw: f"column {c.name!r} is not a number: {_show(raw[i])}")
                dense += self._numeric_dense(c, x, miss)
                if c.bucketize:
                    bags.append(self._buckets(c, x, miss))
            elif c.kind == "categorical":
                bags.append(self._categories(c, as_text(raw), miss))
            else:
                bags.append(self._multi(c, raw, miss))
        extras = self.side.encode(columns, self.missing, flag) if self.side else None
        good = ~bad
        dense_arr = (np.stack(dense, axis=1)[good] if dense else np.zeros((int(good.sum()), 0))).astype(np.float32)
        batch = TabularBatch.from_bags(labels[good], dense_arr, [[b[i] for i in np.flatnonzero(good)]
                                                                 if isinstance(b, list) else b[good] for b in bags])
        if extras is not None:
            batch = dataclasses.replace(batch, extras={k: v[good] for k, v in extras.items()})
        return batch, sorted(reasons.items())

    def _all_labels(self, columns: dict, flag, n: int) -> np.ndarray:
        """float32 [B]: 0/1 (binary) or the number (regression, in the label's units); [B, T] 0/1
        for T multitask labels. NaN without labels."""
        s = self.schema
        if s.label_kind == "multitask":
            if not self.with_labels:
                return np.full((n, len(s.tasks)), np.nan, np.float32)
            return np.stack([self._labels(label, columns[label.column], flag) for label in s.tasks], axis=1)
        if not self.with_labels:
            return np.full(n, np.nan, np.float32)
        if s.label_kind == "regression":
            return self._number(s.label, columns[s.label.column], flag)
        return self._labels(s.label, columns[s.label.column], flag)

    def _number(self, label: Label, raw, flag) -> np.ndarray:
        miss = missing_mask(raw, self.missing)
        flag(miss, lambda i: f"label column {label.column!r} is missing")
        x, not_number = parse_numbers(raw, miss)
        flag(not_number, lambda i: f"label column {label.column!r} is not a number: {_show(raw[i])} (a regression "
                                   f"label)")
        flag(~miss & ~not_number & ~np.isfinite(x), lambda i: f"label column {label.column!r} is not finite: "
                                                             f"{_show(raw[i])}")
        return np.where(np.isfinite(x), x, 0.0).astype(np.float32)

    def _labels(self, label: Label, raw, flag) -> np.ndarray:
        miss = missing_mask(raw, self.missing)
        flag(miss, lambda i: f"label column {label.column!r} is missing")
        if not label.positive and not label.negative:
            x, not_number = parse_numbers(raw, miss)
            flag(not_number, lambda i: f"label column {label.column!r} is not a number: {_show(raw[i])}")
            flag(~miss & ~not_number & ~np.isin(x, (0.0, 1.0, -1.0)),
                 lambda i: f"label must be 0 or 1 (or -1/+1), got {_show(raw[i])}; for other values set "
                           f"label.positive / label.negative in the schema")
            return (x > 0).astype(np.float32)
        text = as_text(raw)
        pos = np.isin(text, np.array(label.positive, dtype=object))
        neg = np.isin(text, np.array(label.negative, dtype=object)) if label.negative else ~pos
        flag(~pos & ~neg & ~miss, lambda i: f"label {_show(raw[i])} is neither positive {label.positive} "
                                            f"nor negative {label.negative} (schema label)")
        return pos.astype(np.float32)

    def _numeric_dense(self, c: Column, x: np.ndarray, miss: np.ndarray) -> list[np.ndarray]:
        out = []
        if c.dense:
            v = pre_standardize(c, x)
            stats = c.stats or {}
            if "standardize" in c.transforms:
                std = stats["std"] if stats["std"] > 0 else 1.0
                v = (v - stats["mean"]) / std
                fill = 0.0
            else:
                fill = stats.get("mean", 0.0) if stats.get("mean") == stats.get("mean") else 0.0
            out.append(np.where(miss | np.isnan(v), fill, v))
        if c.missing_indicator:
            out.append(miss.astype(np.float64))
        return out

    def _buckets(self, c: Column, x: np.ndarray, miss: np.ndarray) -> np.ndarray:
        edges = np.asarray(_fitted(c)["edges"], np.float64)
        inner = edges[1:-1]
        bucket = np.searchsorted(inner, np.where(miss, 0.0, x), side="left")
        table = np.array([feature_id(c.name, f"#{k}") for k in range(len(inner) + 1)], np.int64)
        return np.where(miss | np.isnan(x), feature_id(c.name, MISSING_TOKEN), table[bucket])

    def _categories(self, c: Column, text: np.ndarray, miss: np.ndarray) -> np.ndarray:
        text = np.where(miss, MISSING_TOKEN, text)
        vocab = self._rare.get(c.name)
        if vocab is not None:
            known = np.isin(text, np.array(list(vocab), dtype=object)) | miss
            text = np.where(known, text, RARE_TOKEN)
        return feature_ids(c.name, text)

    def _multi(self, c: Column, raw, miss) -> list[np.ndarray]:
        vocab = self._rare.get(c.name)
        bags = []
        for value, m in zip(raw, miss):
            tokens = bag_values(value, c.separator) if not m else []
            tokens = [t for t in tokens if t not in self.missing] or [MISSING_TOKEN]
            if vocab is not None:
                tokens = [t if t in vocab or t == MISSING_TOKEN else RARE_TOKEN for t in tokens]
            bags.append(tokens)
        flat = np.array([t for b in bags for t in b], dtype=object)
        # A behaviour sequence's values are hashed in its candidate's id space (the same item,
        # the same id and table rows); its "no history" stays its own id, not the candidate's missing.
        ids = feature_ids(c.sequence_of or c.name, flat) if len(flat) else np.empty(0, np.int64)
        if c.sequence_of and len(flat):
            ids[flat == MISSING_TOKEN] = feature_id(c.name, MISSING_TOKEN)
        cut = np.cumsum([len(b) for b in bags])[:-1]
        return np.split(ids, cut) if bags else []


def _show(value) -> str:
    return show(str(value).encode())
