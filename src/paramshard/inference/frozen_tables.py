"""A model file's tables as plain torch modules, for a model exported to TorchScript or ONNX.

A served SparseEmbedding reads its rows through numpy (serving.LocalTable); an exported
module must hold them itself and look ids up with tensor operations only. So each table
becomes a ``FrozenTable``: its rows as one dense buffer, its ids as an int64 buffer sorted
(as int64: ids are uint64 bit patterns, and the search below compares signed values), a
branchless binary search with a fixed number of steps (a gather and a compare each: no
searchsorted, which ONNX lacks), and, for an id the table does not hold, exactly the row
LocalTable.lookup gives it: its deterministic initial row (paramshard.placement.sparse_hash,
here with int64 arithmetic, which wraps as the uint64 arithmetic there does), rounded to
the table's row format, or zeros when the admission policy would not have given it one.
A ``FrozenHashedTable`` is a HashedEmbeddingBag with its id hash in tensor operations.

Both take what nn.EmbeddingBag takes (ids [n, bag], or flat ids with offsets and
per-sample weights) and pool in the table's mode, so a model's forward runs unchanged.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn

from paramshard.errors import ConfigError
from paramshard.placement import sparse_hash

MASK64 = (1 << 64) - 1
# Rows as the servers store them: how an unseen id's initial row is rounded (row_formats.rounded).
ROUNDING = {"float32": None, "float16": torch.float16, "bfloat16": torch.bfloat16}


def signed(value: int) -> int:
    """A uint64 constant as the int64 with the same bits."""
    value &= MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


C1, C2 = signed(int(sparse_hash._C1)), signed(int(sparse_hash._C2))
GOLDEN = int(sparse_hash._GOLDEN)
SALT_ADMIT = signed(int(sparse_hash._SALT_ADMIT))


def shift_right(z: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of uint64 bit patterns held as int64 (torch's >> is arithmetic)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def mix64(z: torch.Tensor) -> torch.Tensor:
    """sparse_hash.mix64 on int64 tensors: the same bits (products wrap modulo 2**64)."""
    z = (z ^ shift_right(z, 30)) * C1
    z = (z ^ shift_right(z, 27)) * C2
    return z ^ shift_right(z, 31)


def mix64_int(value: int) -> int:
    """sparse_hash.mix64 of one Python int, as an int64 constant."""
    return signed(int(sparse_hash.mix64(np.array([value & MASK64], np.uint64))[0]))


def lower_bound(keys: torch.Tensor, x: torch.Tensor, n: int) -> torch.Tensor:
    """For each of ``x``, the number of ``keys`` (sorted int64, ``n`` of them, n >= 1) below it:
    a binary search of a fixed ceil(log2(n + 1)) steps, each a gather and a compare."""
    pos = torch.zeros_like(x)
    step = 1 << (n.bit_length() - 1)          # the largest power of two <= n
    while step:
        cand = pos + step
        move = (cand <= n) & (keys[torch.clamp(cand - 1, max=n - 1)] < x)
        pos = torch.where(move, cand, pos)
        step >>= 1
    return pos


def pool(rows: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor | None,
         weights: torch.Tensor | None, mode: str) -> torch.Tensor:
    """nn.EmbeddingBag's pooling of looked-up ``rows`` ([*ids.shape, dim]): per row of a 2-D
    ``ids`` without offsets, else per bag starting at each offset (an empty bag: zeros)."""
    if offsets is None:
        if weights is not None:
            rows = rows * weights.unsqueeze(-1)
        return rows.sum(dim=1) if mode == "sum" else rows.mean(dim=1)
    n, bags = ids.shape[0], offsets.shape[0]
    # The bag of each id: how many bags start at or before it, minus one (empty bags start
    # where the next does, and a bag starting at n holds nothing).
    starts = torch.zeros(n + 1, dtype=torch.int64).index_add(0, offsets, torch.ones_like(offsets))
    bag = torch.cumsum(starts[:n], dim=0) - 1
    if weights is not None:
        rows = rows * weights.unsqueeze(1)
    out = torch.zeros(bags, rows.shape[1], dtype=rows.dtype).index_add(0, bag, rows)
    if mode == "mean":
        count = torch.zeros(bags, dtype=rows.dtype).index_add(0, bag, torch.ones(n, dtype=rows.dtype))
        out = out / torch.clamp(count, min=1.0).unsqueeze(1)
    return out


class FrozenTable(nn.Module):
    """serving.LocalTable (a model file's table) as buffers and tensor operations."""

    ids: torch.Tensor           # the buffers (declared: nn.Module's attribute lookup is untyped)
    rows: torch.Tensor
    columns: torch.Tensor
    scale2: torch.Tensor
    scale: torch.Tensor

    def __init__(self, table, mode: str = "sum", unknown: str = "initial"):
        super().__init__()
        if unknown not in ("initial", "zeros"):
            raise ConfigError(f"unknown={unknown!r}: expected 'initial' or 'zeros'")
        ids = np.asarray(table.ids, np.uint64).view(np.int64)
        order = np.argsort(ids, kind="stable")
        self.register_buffer("ids", torch.from_numpy(ids[order].copy()))
        self.register_buffer("rows", torch.from_numpy(np.ascontiguousarray(table.rows[order], np.float32)))
        self.name, self.mode, self.dim, self.size = table.name, mode, int(table.dim), len(ids)
        # What an unseen id reads (LocalTable.lookup): its initial row when the table would
        # create one at the first lookup (min_count 1) and the probability filter admits it.
        self.initial = unknown == "initial" and table.min_count == 1
        self.seed_key = mix64_int(table.seed * GOLDEN + GOLDEN)      # wraps as numpy's uint64 does
        pairs = (self.dim + 1) // 2
        self.register_buffer("columns", torch.tensor([signed(k * GOLDEN) for k in range(1, pairs + 1)],
                                                     dtype=torch.int64))
        self.register_buffer("scale2", torch.tensor(np.float32(2 * table.init_scale)))
        self.register_buffer("scale", torch.tensor(np.float32(table.init_scale)))
        self.rounding = ROUNDING[table.dtype]
        # admitted_by_probability: (h >> 11) * 2**-53 < p, i.e. (h >> 11) < ceil(p * 2**53)
        # (a power-of-two scaling is exact): integers only.
        self.admit_all = table.probability >= 1.0
        self.admit_below = int(math.ceil(table.probability * float(1 << 53))) if not self.admit_all else 0
        self.admit_key = signed(SALT_ADMIT ^ mix64_int(table.seed))

    def initial_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """sparse_hash.initial_rows (rounded to the row format) of flat int64 ids -> [n, dim]."""
        base = mix64(ids ^ self.seed_key)
        h = mix64(base.unsqueeze(1) + self.columns.unsqueeze(0))            # [n, pairs]
        bits = torch.stack([shift_right(h, 40), shift_right(h, 8) & 0xFFFFFF], dim=2)
        bits = bits.reshape(ids.shape[0], -1)[:, :self.dim]
        unit = bits.to(torch.float32) * (1.0 / (1 << 24))                  # exact: 24-bit integers
        rows = unit * self.scale2 - self.scale
        if self.rounding is not None:
            rows = rows.to(self.rounding).to(torch.float32)
        if not self.admit_all:
            h = mix64(ids ^ self.admit_key)
            rows = rows * (shift_right(h, 11) < self.admit_below).to(torch.float32).unsqueeze(1)
        return rows

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of flat int64 ``ids`` -> [n, dim]."""
        if self.initial:
            unseen = self.initial_rows(ids)
        else:
            unseen = torch.zeros(ids.shape[0], self.dim, dtype=torch.float32)
        if not self.size:
            return unseen
        pos = torch.clamp(lower_bound(self.ids, ids, self.size), max=self.size - 1)
        found = (self.ids[pos] == ids).unsqueeze(1)
        return torch.where(found, self.rows[pos], unseen)

    def forward(self, ids, offsets=None, per_sample_weights=None):
        flat = ids.reshape(-1)
        rows = self.lookup(flat)
        if offsets is None:
            rows = rows.reshape(ids.shape[0], -1, self.dim)
        return pool(rows, ids, offsets, per_sample_weights, self.mode)

    def extra_repr(self) -> str:
        return f"{self.name!r}, rows={self.size}, dim={self.dim}, mode={self.mode!r}"


class FrozenHashedTable(nn.Module):
    """models.hashed.HashedEmbeddingBag with its bucket hash in tensor operations."""

    weight: torch.Tensor

    def __init__(self, table):
        super().__init__()
        self.register_buffer("weight", table.weight.detach().clone())
        self.salt = signed(int(table.salt))
        self.mask = int(table.num_embeddings) - 1
        self.mode, self.name = table.mode, table.table_name

    def forward(self, ids, offsets=None, per_sample_weights=None):
        flat = ids.reshape(-1)
        rows = self.weight[mix64(flat ^ self.salt) & self.mask]
        if offsets is None:
            rows = rows.reshape(ids.shape[0], -1, self.weight.shape[1])
        return pool(rows, ids, offsets, per_sample_weights, self.mode)
