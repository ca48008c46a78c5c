"""libsvm (``label idx:val ...``) and libffm (``label field:idx:val ...``) text.

Labels 0/1 and -1/+1 are accepted (-1 -> 0). Feature indices are passed
through unchanged as uint64 ids (no hashing): a libffm file written with the
Criteo reader's ids yields the very same ids. Tokens are separated by spaces
or tabs.

Speed: a chunk is first parsed whole with numpy over its bytes (token and
colon positions, then ``_ascii8`` for the numbers); only if any check fails
does the chunk go through the per-line Python parser, which is the reference:
it says which line is bad and why, and parses the rest.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paramshard.errors import ConfigError
from paramshard.data.readers._ascii8 import Windows, parse_float, parse_uint
from paramshard.data.readers._reader import DEFAULT_CHUNK_BYTES, MAX_LINE_BYTES, LineReader
from paramshard.data.errors import show

FORMATS = ("auto", "libsvm", "libffm")
_LABELS = {b"0": 0.0, b"1": 1.0, b"+1": 1.0, b"-1": 0.0}
_WHITESPACE = bytes.maketrans(b"\t\r", b"  ")
_MAX_FIELD = 2**31 - 1


@dataclass(frozen=True)
class SparseBatch:
    """CSR rows: row i's features are ids/values/fields[offsets[i]:offsets[i+1]]."""
    labels: np.ndarray          # float32[B]
    ids: np.ndarray             # uint64[nnz]
    values: np.ndarray          # float32[nnz]
    offsets: np.ndarray         # int64[B+1]
    fields: np.ndarray | None   # int32[nnz] for libffm, None for libsvm

    def __len__(self) -> int:
        return len(self.labels)

    def take(self, start: int, stop: int) -> "SparseBatch":
        lo, hi = self.offsets[start], self.offsets[stop]
        return SparseBatch(self.labels[start:stop], self.ids[lo:hi], self.values[lo:hi],
                           self.offsets[start:stop + 1] - lo,
                           None if self.fields is None else self.fields[lo:hi])

    @staticmethod
    def concat(batches) -> "SparseBatch":
        counts = np.concatenate([np.diff(b.offsets) for b in batches])
        has_fields = any(b.fields is not None for b in batches)
        # A chunk read before the format was known has no features, hence no fields.
        fields = (np.concatenate([np.zeros(0, np.int32) if b.fields is None else b.fields
                                  for b in batches]) if has_fields else None)
        return SparseBatch(np.concatenate([b.labels for b in batches]),
                           np.concatenate([b.ids for b in batches]),
                           np.concatenate([b.values for b in batches]),
                           np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                           fields)


class _Slow(Exception):
    """The whole-chunk fast path met something it does not handle; use the per-line parser."""


def _batch(labels, ids, values, counts, fields, parts: int) -> SparseBatch:
    offsets = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    return SparseBatch(np.asarray(labels, np.float32), np.asarray(ids, np.uint64),
                       np.asarray(values, np.float32), offsets,
                       np.asarray(fields, np.int32) if parts == 3 else None)


def parse_fast(buf: bytes, parts: int) -> SparseBatch:
    """Whole lines of a clean chunk (tabs already spaces) -> batch, with numpy
    over the bytes; raises _Slow on anything unusual (the per-line parser then decides)."""
    a = np.frombuffer(buf, np.uint8)
    newline = a == ord("\n")
    gap = newline | (a == ord(" "))
    tok_start = np.flatnonzero(~gap & np.r_[True, gap[:-1]])
    tok_end = np.flatnonzero(~gap & np.r_[gap[1:], True]) + 1
    line_end = np.flatnonzero(newline)
    per_line = np.bincount(np.searchsorted(line_end, tok_start), minlength=len(line_end))
    if len(line_end) == 0 or per_line.min() == 0:
        raise _Slow  # no lines, or an empty line
    first_tok = np.r_[0, np.cumsum(per_line)[:-1]]
    labels = _labels(a, tok_start[first_tok], tok_end[first_tok] - tok_start[first_tok])
    is_feature = np.ones(len(tok_start), bool)
    is_feature[first_tok] = False
    starts, ends = tok_start[is_feature], tok_end[is_feature]
    colons = np.flatnonzero(a == ord(":"))
    owner = np.searchsorted(starts, colons, side="right") - 1
    if (len(colons) != (parts - 1) * len(starts)
            or (np.bincount(owner, minlength=len(starts)) != parts - 1).any()):
        raise _Slow  # a token of the wrong shape (or a colon in a label)
    # piece p of a token runs from after colon p-1 (or the token start) to colon p (or its end)
    cuts = colons.reshape(-1, parts - 1)
    lo = np.column_stack([starts, cuts + 1])
    hi = np.column_stack([cuts, ends])
    lens = hi - lo
    if len(lens) and lens.min() < 1:
        raise _Slow  # an empty piece
    win = Windows(buf)
    ids, ok = parse_uint(win, lo[:, -2], lens[:, -2])
    fields = []
    if parts == 3:
        fields, ok_field = parse_uint(win, lo[:, 0], lens[:, 0])
        ok &= ok_field & (fields <= _MAX_FIELD)
    values, plain = parse_float(a, win, lo[:, -1], lens[:, -1])
    if not ok.all():
        raise _Slow
    if not plain.all():  # exponents and the like: numpy parses just those, as float() would
        odd = np.flatnonzero(~plain)
        try:
            values[odd] = np.array([buf[lo[i, -1]:hi[i, -1]] for i in odd]).astype(np.float64)
        except ValueError:
            raise _Slow from None
    with np.errstate(over="ignore"):  # too big for float32 becomes inf, rejected next
        values = values.astype(np.float32)
    if not np.isfinite(values).all():
        raise _Slow
    return _batch(labels, ids, values, per_line - 1, fields, parts)


def _labels(a, starts, lens) -> np.ndarray:
    """Label tokens 0, 1, -1, +1 -> float32 0/1; _Slow for anything else."""
    c0 = a.take(starts, mode="clip")
    c1 = a.take(starts + 1, mode="clip")
    one_char = (lens == 1) & ((c0 == ord("0")) | (c0 == ord("1")))
    signed = (lens == 2) & ((c0 == ord("-")) | (c0 == ord("+"))) & (c1 == ord("1"))
    if not (one_char | signed).all():
        raise _Slow
    return ((one_char & (c0 == ord("1"))) | (signed & (c0 == ord("+")))).astype(np.float32)


def parse_line(line: bytes, parts: int):
    """One line -> (label, ids, values, fields) or a reason string (the reference parser)."""
    toks = line.translate(_WHITESPACE).split()
    if not toks:
        return "empty line (expected a label and features)"
    if toks[0] not in _LABELS:
        return f"label must be 0, 1, -1 or +1, got {show(toks[0])}"
    shape = "idx:val" if parts == 2 else "field:idx:val"
    ids, values, fields = [], [], []
    for n, tok in enumerate(toks[1:], 1):
        p = tok.split(b":")
        if len(p) != parts or not all(p):
            return f"feature {n} is not {shape}: {show(tok)}"
        if not p[-2].isdigit() or int(p[-2]) >= 2**64:
            return f"feature {n}: index must be an integer in [0, 2**64), got {show(p[-2])}"
        if parts == 3 and (not p[0].isdigit() or int(p[0]) > _MAX_FIELD):
            return f"feature {n}: field must be an integer in [0, 2**31), got {show(p[0])}"
        try:
            value = float(p[-1])
        except ValueError:
            value = None
        with np.errstate(over="ignore"):
            value32 = None if value is None else np.float32(value)
        if value32 is None or not np.isfinite(value32):
            return f"feature {n}: value must be a finite float32 number, got {show(p[-1])}"
        ids.append(int(p[-2]))
        values.append(value)
        if parts == 3:
            fields.append(int(p[0]))
    return _LABELS[toks[0]], ids, values, fields


def parse_slow(buf: bytes, parts: int):
    labels, ids, values, fields, counts, bad = [], [], [], [], [], []
    for i, line in enumerate(buf.split(b"\n")[:-1]):
        got = parse_line(line, parts)
        if isinstance(got, str):
            bad.append((i, got))
            continue
        labels.append(got[0])
        ids += got[1]
        values += got[2]
        fields += got[3]
        counts.append(len(got[1]))
    return _batch(labels, ids, values, counts, fields, parts), bad


def detect_parts(buf: bytes) -> int | None:
    """2 (libsvm) or 3 (libffm) from the first well-shaped feature token, or None."""
    for line in buf.split(b"\n"):
        for tok in line.translate(_WHITESPACE).split()[1:]:
            if tok.count(b":") in (1, 2):
                return tok.count(b":") + 1
    return None


class LibsvmReader(LineReader[SparseBatch]):
    """Iterate ``SparseBatch`` es of ``batch_size`` rows over libsvm/libffm files.

    ``format="auto"`` decides from the first feature token (``a:b`` -> libsvm,
    ``a:b:c`` -> libffm); after that, lines of the other shape are bad lines.
    Bad lines raise ``DataFormatError`` or, with ``skip_bad_lines=True``, are
    counted in ``bad_lines`` and dropped. A line longer than ``max_line_bytes``
    always raises: it is a wrong or broken file, not a bad line.
    """

    def __init__(self, paths, batch_size: int, skip_bad_lines: bool = False,
                 format: str = "auto", chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 max_line_bytes: int = MAX_LINE_BYTES):
        if format not in FORMATS:
            raise ConfigError(f"format={format!r}: must be one of {', '.join(FORMATS)}")
        super().__init__(paths, batch_size, skip_bad_lines, chunk_bytes, max_line_bytes)
        self.format = format
        self._parts = {"libsvm": 2, "libffm": 3}.get(format)   # read_task: detected once, kept

    def __iter__(self):
        self._parts = {"libsvm": 2, "libffm": 3}.get(self.format)
        return super().__iter__()

    def _parse(self, chunk: bytes):
        if self._parts is None:
            self._parts = detect_parts(chunk)
        parts = self._parts or 2  # undetected: no valid feature in the chunk, so no matter
        try:
            return parse_fast(chunk.translate(_WHITESPACE), parts), []
        except _Slow:
            return parse_slow(chunk, parts)

    def _concat(self, batches):
        return SparseBatch.concat(batches)
