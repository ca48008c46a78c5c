"""Criteo display-ads TSV: ``label \\t I1..I13 \\t C1..C26``, any feature may be empty.

Each chunk of lines is parsed with numpy over the raw bytes (tab positions,
digit and hex-digit lookups), so no Python code runs per line or per field;
a per-line Python check (``diagnose``) runs only on lines already known to be
bad, to say why.

Outputs of one row:
- label: 0.0 or 1.0.
- dense[j] = log1p(max(I_j, 0)), missing -> 0. The log tames the heavy-tailed
  counts; negatives (Criteo's I2 has a few -1, -2) carry no count, so clip to 0.
- sparse_ids[f] = (f << 32) | int(C_f, 16) for f = 0..25 (C1 is field 0). The
  field in the high bits makes ids of different fields distinct; within a field
  distinct hex values up to 8 digits give distinct ids (leading zeros and case
  do not matter: "0a" == "A"). Longer values are hashed to 32 bits with
  zlib.crc32 of the lower-cased text (these can collide). A missing value is
  (f << 32) | 0xFFFFFFFF, which the literal value "ffffffff" shares.
"""
from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

import numpy as np

from paramshard.data.readers._ascii8 import Windows, parse_decimal, parse_hex
from paramshard.data.readers._reader import DEFAULT_CHUNK_BYTES, MAX_LINE_BYTES, LineReader
from paramshard.data.errors import show

NUM_DENSE = 13
NUM_SPARSE = 26
NUM_COLUMNS = 1 + NUM_DENSE + NUM_SPARSE
MISSING = 0xFFFFFFFF
MAX_INT_DIGITS = 18  # fits int64 with room; real Criteo counts have at most 7

_HEX_BYTES = b"0123456789abcdefABCDEF"
_INT_RE = re.compile(rb"-?[0-9]+")


@dataclass(frozen=True)
class CriteoBatch:
    labels: np.ndarray      # float32[B]
    dense: np.ndarray       # float32[B, 13], already log1p-transformed
    sparse_ids: np.ndarray  # uint64[B, 26]

    def __len__(self) -> int:
        return len(self.labels)

    def take(self, start: int, stop: int) -> "CriteoBatch":
        return CriteoBatch(self.labels[start:stop], self.dense[start:stop], self.sparse_ids[start:stop])

    def torch(self) -> dict:
        """The batch as tensors, ids as int64 (the bit patterns of the uint64 ids, which is
        what SparseEmbedding takes): ``model(b["dense"], b["ids"])``."""
        import torch
        return {"dense": torch.from_numpy(self.dense), "ids": torch.from_numpy(self.sparse_ids.view(np.int64)),
                "labels": torch.from_numpy(self.labels)}

    @staticmethod
    def concat(batches) -> "CriteoBatch":
        return CriteoBatch(np.concatenate([b.labels for b in batches]),
                           np.concatenate([b.dense for b in batches]),
                           np.concatenate([b.sparse_ids for b in batches]))


def dense_transform(values: np.ndarray) -> np.ndarray:
    """Raw integer counts (missing already 0) -> the float32 features the reader yields."""
    return np.log1p(np.maximum(values, 0).astype(np.float32))


def hash_long_value(raw: bytes) -> int:
    """32-bit value of a categorical longer than 8 hex digits."""
    return zlib.crc32(raw.lower())


def diagnose(line: bytes) -> str | None:
    """Why one line (without its newline) is not valid Criteo TSV; None if it is."""
    cols = line.split(b"\t")
    if len(cols) != NUM_COLUMNS:
        empty = " (empty line)" if line == b"" else ""
        return f"expected {NUM_COLUMNS} tab-separated columns, got {len(cols)}{empty}"
    if cols[0] not in (b"0", b"1"):
        return f"label (column 1) must be 0 or 1, got {show(cols[0])}"
    for j in range(1, 1 + NUM_DENSE):
        v = cols[j]
        if v and not _INT_RE.fullmatch(v):
            return f"column {j + 1} (integer feature I{j}) is not an integer: {show(v)}"
        if len(v.lstrip(b"-")) > MAX_INT_DIGITS:
            return f"column {j + 1} (integer feature I{j}) has more than {MAX_INT_DIGITS} digits: {show(v)}"
    for j in range(1 + NUM_DENSE, NUM_COLUMNS):
        v = cols[j]
        if v.translate(None, _HEX_BYTES):
            return (f"column {j + 1} (categorical feature C{j - NUM_DENSE}) "
                    f"is not hexadecimal: {show(v)}")
    return None


def _parse_ints(a, buf, win, starts, lens):
    """Signed decimal fields -> (int64 values, missing -> 0; valid mask)."""
    neg = (lens > 0) & (a.take(starts, mode="clip") == ord("-"))
    ndig = lens - neg
    val, valid = parse_decimal(win.at(starts + neg), ndig)
    val = val.astype(np.int64)
    valid &= (lens == 0) | (ndig >= 1)
    for r, c in zip(*np.nonzero(ndig > 8)):  # rare: Criteo's counts have at most 7 digits
        raw = buf[starts[r, c]:starts[r, c] + lens[r, c]]
        valid[r, c] = bool(_INT_RE.fullmatch(raw)) and ndig[r, c] <= MAX_INT_DIGITS
        val[r, c] = abs(int(raw)) if valid[r, c] else 0
    return np.where(neg, -val, val), valid


def _parse_hex(buf, win, starts, lens):
    """Hex fields -> (uint64 32-bit values, missing -> MISSING; valid mask)."""
    val, valid = parse_hex(win.at(starts), lens)
    for r, c in zip(*np.nonzero(lens > 8)):  # rare: Criteo's own values are 8 digits
        raw = buf[starts[r, c]:starts[r, c] + lens[r, c]]
        valid[r, c] = not raw.translate(None, _HEX_BYTES)
        val[r, c] = hash_long_value(raw)
    val[lens == 0] = MISSING
    return val, valid


def parse_chunk(buf: bytes) -> tuple[CriteoBatch, np.ndarray]:
    """Whole lines (each ending in b'\\n') -> (batch of the good lines, indices of the bad ones)."""
    a = np.frombuffer(buf, np.uint8)
    newlines = np.flatnonzero(a == ord("\n"))
    seps = np.flatnonzero((a == ord("\t")) | (a == ord("\n")))  # every field ends at one
    is_newline = a[seps] == ord("\n")
    line_of_sep = np.cumsum(is_newline) - is_newline
    ncols_ok = np.bincount(line_of_sep, minlength=len(newlines)) == NUM_COLUMNS
    starts: np.ndarray = np.empty_like(seps)      # then [lines, NUM_COLUMNS]
    starts[:1] = 0
    starts[1:] = seps[:-1] + 1  # the field after a newline is a line's first field
    if not ncols_ok.all():
        keep = ncols_ok[line_of_sep]
        seps, starts = seps[keep], starts[keep]
    ends = seps.reshape(-1, NUM_COLUMNS)
    starts = starts.reshape(-1, NUM_COLUMNS)
    lens = ends - starts
    rows = np.flatnonzero(ncols_ok)

    label_byte = a.take(starts[:, 0], mode="clip")
    ok = (lens[:, 0] == 1) & ((label_byte == ord("0")) | (label_byte == ord("1")))
    win = Windows(buf)
    ints, ints_ok = _parse_ints(a, buf, win, starts[:, 1:1 + NUM_DENSE], lens[:, 1:1 + NUM_DENSE])
    hexes, hex_ok = _parse_hex(buf, win, starts[:, 1 + NUM_DENSE:], lens[:, 1 + NUM_DENSE:])
    ok &= ints_ok.all(axis=1) & hex_ok.all(axis=1)

    fields = np.arange(NUM_SPARSE, dtype=np.uint64) << np.uint64(32)
    batch = CriteoBatch(labels=(label_byte[ok] - ord("0")).astype(np.float32),
                        dense=dense_transform(ints[ok]),
                        sparse_ids=hexes[ok] | fields)
    bad = np.union1d(np.flatnonzero(~ncols_ok), rows[~ok])
    return batch, bad


class CriteoReader(LineReader[CriteoBatch]):
    """Iterate ``CriteoBatch`` es of ``batch_size`` rows (the last may be short)
    over one or more files (plain or .gz), in order; batches span file ends.

    A bad line raises ``DataFormatError`` (``path:line: reason``); with
    ``skip_bad_lines=True`` it is dropped and counted in ``bad_lines``
    (first few messages in ``bad_line_examples``) and every good line still
    comes out. A line longer than ``max_line_bytes`` always raises: it is a
    wrong or broken file, not a bad line.
    """

    def __init__(self, paths, batch_size: int, skip_bad_lines: bool = False,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, max_line_bytes: int = MAX_LINE_BYTES):
        super().__init__(paths, batch_size, skip_bad_lines, chunk_bytes, max_line_bytes)

    def _parse(self, chunk: bytes):
        batch, bad = parse_chunk(chunk)
        if not len(bad):
            return batch, []
        lines = chunk.split(b"\n")
        return batch, [(int(i), diagnose(lines[i]) or "malformed line") for i in bad]

    def _concat(self, batches):
        return CriteoBatch.concat(batches)
