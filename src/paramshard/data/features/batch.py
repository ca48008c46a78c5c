"""TabularBatch: what the schema-driven reader yields and paramshard.models take.

Feature ids come in one of two shapes:
- every field holds one id (categorical and bucketized columns): ``ids`` is
  int64 [B, F] and ``offsets``/``weights`` are None;
- some field holds a bag (a multi-valued column): ``ids`` is flat int64 [N],
  ``offsets`` int64 [B*F] starts the bag of (row b, field f) at index b*F+f,
  and ``weights`` float32 [N] is 1/len(bag), so a bag pools to the mean.
A bag's ids are in the order of its cell (``c|a|b``, a Parquet list: encode.py),
and ``take`` / ``select`` / ``concat`` keep that order, so a model over an
ordered sequence can read it between a bag's offsets.
Both shapes go straight into nn.EmbeddingBag / SparseEmbedding. Ids are the
int64 bit patterns of unsigned 64-bit hashes (negative values are normal).
``extras``: per-row columns carried beside the features and never fed to the model
(data/features/side_columns.py: a sample weight, a group key for GAUC), or None.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TabularBatch:
    labels: np.ndarray              # float32 [B]: 0 or 1, a regression label's number; [B, T] multitask
    dense: np.ndarray               # float32 [B, D]
    ids: np.ndarray                 # int64 [B, F], or flat [N] with offsets
    num_fields: int
    offsets: np.ndarray | None = None
    weights: np.ndarray | None = None
    extras: dict | None = None      # {name: array [B]}: side columns (not features)

    def __len__(self) -> int:
        return len(self.labels)

    @staticmethod
    def from_bags(labels, dense, fields: list) -> "TabularBatch":
        """``fields``: per field either an int64 [B] array or a list of B arrays (bags)."""
        n, f = len(labels), len(fields)
        if all(isinstance(x, np.ndarray) for x in fields):
            ids = np.stack(fields, axis=1) if f else np.zeros((n, 0), np.int64)
            return TabularBatch(labels, dense, ids.astype(np.int64, copy=False), f)
        bags = [[x[i:i + 1] if isinstance(x, np.ndarray) else x[i] for x in fields] for i in range(n)]
        flat = [bag for row in bags for bag in row]
        lengths = np.fromiter((len(b) for b in flat), np.int64, len(flat))
        ids = np.concatenate(flat).astype(np.int64) if flat else np.empty(0, np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(flat) else lengths
        weights = np.repeat(1.0 / np.maximum(lengths, 1), lengths).astype(np.float32)
        return TabularBatch(labels, dense, ids, f, offsets, weights)

    def take(self, start: int, stop: int) -> "TabularBatch":
        extras = self._extras(slice(start, stop))
        if self.offsets is None:
            return TabularBatch(self.labels[start:stop], self.dense[start:stop], self.ids[start:stop], self.num_fields,
                                extras=extras)
        f = self.num_fields
        assert self.weights is not None        # bags: offsets and weights come together (module docstring)
        lo = self.offsets[start * f] if start * f < len(self.offsets) else len(self.ids)
        hi = self.offsets[stop * f] if stop * f < len(self.offsets) else len(self.ids)
        return TabularBatch(self.labels[start:stop], self.dense[start:stop], self.ids[lo:hi], f,
                            self.offsets[start * f:stop * f] - lo, self.weights[lo:hi], extras)

    def select(self, rows: np.ndarray) -> "TabularBatch":
        """The given rows, in the given order (shuffling)."""
        if self.offsets is None:
            return TabularBatch(self.labels[rows], self.dense[rows], self.ids[rows], self.num_fields,
                                extras=self._extras(rows))
        return TabularBatch.concat([self.take(int(r), int(r) + 1) for r in rows])

    def _extras(self, rows) -> dict | None:
        return None if self.extras is None else {k: v[rows] for k, v in self.extras.items()}

    @staticmethod
    def concat(batches) -> "TabularBatch":
        batches = list(batches)
        first = batches[0]
        labels = np.concatenate([b.labels for b in batches])
        dense = np.concatenate([b.dense for b in batches])
        # Batches of one reader carry the same side columns (or none).
        extras = None if first.extras is None else {k: np.concatenate([b.extras[k] for b in batches])
                                                    for k in first.extras}
        if all(b.offsets is None for b in batches):
            return TabularBatch(labels, dense, np.concatenate([b.ids for b in batches]), first.num_fields,
                                extras=extras)
        parts = [b._bagged() for b in batches]
        starts = np.cumsum([0] + [len(p.ids) for p in parts[:-1]])
        return TabularBatch(labels, dense, np.concatenate([p.ids for p in parts]), first.num_fields,
                            np.concatenate([p.offsets + s for p, s in zip(parts, starts)]),
                            np.concatenate([p.weights for p in parts]), extras)

    def _bagged(self) -> "TabularBatch":
        """The same rows in the flat-with-offsets shape."""
        if self.offsets is not None:
            return self
        n = self.ids.size
        return TabularBatch(self.labels, self.dense, self.ids.reshape(-1), self.num_fields,
                            np.arange(n, dtype=np.int64), np.ones(n, np.float32), self.extras)

    def torch(self) -> dict:
        """The batch as tensors: ``model(b["dense"], b["ids"], b["offsets"], b["weights"])``;
        with a weight side column, ``b["sample_weight"]`` (float32 [B]) too (the group keys are
        for evaluation only: not here, where they would look like ids to the prefetcher)."""
        import torch
        as_t = torch.from_numpy
        out = {"dense": as_t(np.ascontiguousarray(self.dense)), "ids": as_t(np.ascontiguousarray(self.ids)),
               "offsets": None if self.offsets is None else as_t(self.offsets),
               "weights": None if self.weights is None else as_t(self.weights),
               "labels": as_t(np.ascontiguousarray(self.labels))}
        if self.extras is not None and "weight" in self.extras:
            out["sample_weight"] = as_t(self.extras["weight"].astype(np.float32))
        return out
