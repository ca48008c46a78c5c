"""Feature ids from text: a stable 64-bit hash of (field, value).

The same value in the same field gets the same id in every process, run and
machine (BLAKE2b, not Python's salted ``hash``), so trainers that never talk
agree on ids, and a model exported today reads tomorrow's data. The field
name is part of the hashed text, so equal values of different fields get
different ids (``gender=Male`` and ``relationship=Male`` are two rows).

Only distinct values are hashed (``pd.factorize`` first): a column of a
million rows with fifty distinct values costs fifty hashes.
"""
from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

SEPARATOR = "\x1f"               # ASCII unit separator: cannot appear in a field name from a header
MISSING_TOKEN = "\x00missing"    # a field's own id for "no value" (its row learns what missing means)
RARE_TOKEN = "\x00rare"          # values seen fewer than min_count times in the fitted data


def feature_id(field: str, value: str) -> int:
    """The id (as int64, the bit pattern of the unsigned hash) of one value."""
    digest = hashlib.blake2b(f"{field}{SEPARATOR}{value}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


CACHE_PER_FIELD = 1 << 20
_cache: dict[str, dict[str, int]] = {}


def feature_ids(field: str, values) -> np.ndarray:
    """int64 ids of an array of strings (object or str dtype), hashing each distinct value
    once; values seen before in this process come from a per-field cache (the frequent
    values of a CTR column recur in every chunk), bounded to CACHE_PER_FIELD entries."""
    values = np.asarray(values, dtype=object)
    codes, uniques = pd.factorize(values.ravel(), use_na_sentinel=False)
    cache = _cache.setdefault(field, {})
    table = np.empty(len(uniques), np.int64)
    for i, v in enumerate(uniques.tolist()):
        v = str(v)
        hit = cache.get(v)
        if hit is None:
            hit = feature_id(field, v)
            if len(cache) < CACHE_PER_FIELD:
                cache[v] = hit
        table[i] = hit
    return table[codes].reshape(values.shape)
