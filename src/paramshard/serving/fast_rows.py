"""JSON rows -> a TabularBatch without pandas on the way: the batch the schema Encoder makes of
the same rows (serving/rows.py), array for array and bit for bit, in a fraction of the time.

Why: a 100-row request spent ~6 ms (up to 20 on a loaded machine) in the Encoder, nearly all of it
pandas calls per column (factorize, to_numeric, str.strip) made for chunks of a million rows,
while a request's work is a cache lookup per cell. Here every column keeps a cache from a JSON
value to what the Encoder makes of it (a numeric column: the parsed number and whether it is
missing; a categorical one: the feature id; a multi-valued one: the bag's ids). A value not in
the cache is worked out by the Encoder's own functions (encode.py: missing_mask, parse_numbers,
as_text, _categories, _multi, all per value) over the request's new values of that column at
once, so what a value encodes to is by construction what the Encoder gives it. The per-column
steps that mix values (the numeric transforms and buckets, the batch's assembly) are the
Encoder's own functions called on the same arrays.

Cache keys stand for what the Encoder sees, which is not always Python equality: ``True == 1``
(a boolean is refused, so it never reaches a cache), ``-0.0 == 0`` (a numeric column parses
"-0.0" and "0.0" apart: its negative zero has a key of its own), ``1 == 1.0`` (one text "1" in
a categorical column or a bag's list, but "1" and "1.0" as a multi-valued column's whole cell:
numbers there are never cached). Each cache holds at most CACHE_PER_COLUMN values (a client
sending new values each time gets no faster, and memory stays bounded).

Anything the fast path does not take as it is falls back to the Encoder for the whole request
(``Fallback``; counted in ``fallbacks``): a value that is not a string, number, null or (multi)
list, a row that is not an object, a request that is empty or too large, a number that does not
parse (all of these are the Encoder path's BadRequest, with its message), and a parsed number of
magnitude 2**53 or more (pandas parses integer text past float precision differently alone than
among other values, so such a column is parsed as the Encoder parses it, whole). Every column
kind (numeric with its transforms, buckets and indicator; categorical with min_count; multi,
lists and sequences) has a fast path; labels and side columns are not read when serving.
"""
from __future__ import annotations

import math

import numpy as np

from paramshard.data.features.batch import TabularBatch
from paramshard.data.features.encode import as_text, missing_mask, parse_numbers

CACHE_PER_COLUMN = 1 << 18
BIG = float(2 ** 53)       # past it, an integer's text parses differently alone and among floats (pandas)
_NEG_ZERO = object()       # the key of -0.0 in a numeric column (equal to 0 but parsed apart)


class Fallback(Exception):
    """The fast path does not take this request as it is: the Encoder encodes it (or says why not)."""


class _Once:
    """A key no cache holds: a value worked out each time (a number as a multi-valued column's cell)."""
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def _numeric_key(v):
    t = type(v)
    if t is str or v is None or t is int:
        return v
    if t is float:
        return _NEG_ZERO if v == 0.0 and math.copysign(1.0, v) < 0 else v
    raise Fallback


def _categorical_key(v):
    t = type(v)
    if t is str or v is None or t is int or t is float:
        return v
    raise Fallback


def _multi_key(v, max_bag: int):
    t = type(v)
    if t is str or v is None:
        return v
    if t is list:
        if len(v) > max_bag:
            raise Fallback
        for x in v:
            tx = type(x)
            if tx is not str and tx is not int and tx is not float:
                raise Fallback
        return tuple(v)
    if t is int or t is float:
        return _Once(v)
    raise Fallback


def _original(key):
    if key is _NEG_ZERO:
        return -0.0
    if type(key) is _Once:
        return key.value
    return list(key) if type(key) is tuple else key


_SCALARS = frozenset({str, int, float, type(None)})
_TEXT = frozenset({str, type(None)})


class FastEncoder:
    def __init__(self, rows_encoder):
        """``rows_encoder``: serving/rows.py's RowEncoder (its Encoder and its per-value checks)."""
        from paramshard.serving.rows import MAX_BAG
        self.rows = rows_encoder
        self.encoder = rows_encoder._encoder
        self.columns = rows_encoder.columns
        self.max_bag = MAX_BAG
        self.caches: dict[str, dict] = {c.name: {} for c in self.columns}
        self.fallbacks = 0          # requests the Encoder encoded (the fast path did not take them)
        self.fast = 0               # requests the fast path encoded

    def encode(self, columns: dict[str, list], n: int) -> TabularBatch:
        """The batch of ``n`` rows whose raw JSON values are ``columns`` (name -> list or tuple of n values);
        Fallback if the fast path does not take them."""
        enc = self.encoder
        dense, bags = [], []
        for c in self.columns:
            values = columns[c.name]
            if c.kind == "numeric":
                x = self._numeric(c, values)
                miss = np.isnan(x)              # a present value that is not a number fell back
                dense += enc._numeric_dense(c, x, miss)
                if c.bucketize:
                    bags.append(enc._buckets(c, x, miss))
            elif c.kind == "categorical":
                bags.append(self._categorical(c, values))
            else:
                bags.append(self._multi(c, values))
        labels = enc._all_labels({}, None, n)             # labels=False: NaN, the columns are not read
        dense_arr = (np.stack(dense, axis=1) if dense else np.zeros((n, 0))).astype(np.float32)
        self.fast += 1
        return TabularBatch.from_bags(labels, dense_arr, bags)

    # -- per kind: cached values, the new ones worked out by the Encoder's functions ---------------
    # A column's values are looked up as they are (map: no Python step per cell) when no value can
    # be mistaken for another (the types checked first, at C speed); else through a key per value.
    def _found(self, c, keys):
        """(cache, what each key's value encodes to, None where not cached yet)."""
        cache = self.caches[c.name]
        return cache, list(map(cache.get, keys))

    def _fill(self, c, cache, keys, found, results_of):
        """``found`` with its gaps filled: the distinct new keys worked out at once by
        ``results_of(raw values)`` (the Encoder's functions), and cached."""
        new = list(dict.fromkeys(k for k, f in zip(keys, found) if f is None))
        try:
            raw = self.rows._column(c.name, [_original(k) for k in new], "value {i}")
        except Exception:        # noqa: BLE001 - a refused value: the Encoder's path says why, as it says it
            raise Fallback from None
        by_key = dict(zip(new, results_of(raw)))
        if len(cache) < CACHE_PER_COLUMN:
            for k, r in by_key.items():
                if type(k) is not _Once:
                    cache[k] = r
        return [by_key[k] if f is None else f for k, f in zip(keys, found)]

    def _numeric(self, c, values) -> np.ndarray:
        """float64 values, NaN where missing (the Encoder's x)."""
        types = set(map(type, values))
        if not types <= _SCALARS:
            raise Fallback
        # -0.0 == 0 as a key, but "-0.0" parses to -0.0: a column holding a float zero gets keys.
        keys = [_numeric_key(v) for v in values] if float in types and 0.0 in values else values
        cache, found = self._found(c, keys)
        if None in found:
            found = self._fill(c, cache, keys, found, self._parse)
        return np.array(found, np.float64)

    def _parse(self, raw) -> list:
        miss = missing_mask(raw, self.encoder.missing)
        x, not_number = parse_numbers(raw, miss)
        if not_number.any() or (np.abs(x[~np.isnan(x)]) >= BIG).any():
            raise Fallback
        return x.tolist()

    def _categorical(self, c, values) -> np.ndarray:
        if not set(map(type, values)) <= _SCALARS:
            raise Fallback
        cache, found = self._found(c, values)
        if None in found:
            def ids(raw):
                return self.encoder._categories(c, as_text(raw), missing_mask(raw, self.encoder.missing)).tolist()
            found = self._fill(c, cache, values, found, ids)
        return np.array(found, np.int64)

    def _multi(self, c, values) -> list:
        keys = values if set(map(type, values)) <= _TEXT else [_multi_key(v, self.max_bag) for v in values]
        cache, found = self._found(c, keys)
        if None in found:
            def bags(raw):       # each bag in a tuple: ``None in found`` then compares no arrays
                return [(b,) for b in self.encoder._multi(c, raw, missing_mask(raw, self.encoder.missing))]
            found = self._fill(c, cache, keys, found, bags)
        return [f[0] for f in found]
