"""Which columns hold ids: numbers that name things (users, items, places) rather
than measure them. An id is a category, one embedding row per value; read as a
number, a model can only learn a slope over arbitrary labels (issue 23:
MovieLens user_id and movie_id as standardized numbers, DeepFM AUC 0.755; the
same columns as categories, 0.794).

Two rules, both written into the column's note by ``schema infer``:

- **The name.** The name is split into words (``user_id``, ``movieId``,
  ``userID``, ``zip-code`` -> user/id, movie/id, user/id, zip/code) and its last
  word is one of ``ID_WORDS`` (id, code, key, zip, postcode, uuid, ...); or it is
  one glued lowercase word made of a thing and "id" or "code" (``userid``,
  ``movieid``, ``zipcode``; the things are listed, so ``encode`` is not one). Whole words only: ``paid``, ``valid``,
  ``width``, ``idle`` and ``id_count`` (a count) are not ids.
- **The values**, for an integer column whose name says nothing. A sample
  cannot prove a column is an id, so the rule asks for every sign at once:
  1. every value is a whole number >= 0 (a signed quantity is not an id);
  2. at least ``MIN_DISTINCT`` distinct values (below that, a small integer
     quantity such as a rating, an age or hours per week, which the numeric
     path and its quantile buckets already serve);
  3. the distinct values fill at least ``MIN_FILL`` of their range
     (distinct >= MIN_FILL * (max - min + 1)): ids are handed out in
     sequence, while a quantity with that many distinct values is spread
     thin (money, timestamps, sample weights, durations);
  4. the rows spread over that range instead of bunching: skewness within
     +-``MAX_SKEW`` (counts and durations pile up at the low end) and at most
     ``MAX_MIDDLE`` of the rows in the middle half of the range (a measure
     such as a score bunches around a typical value: a normal curve puts 92%
     there, evenly spread ids about 50%).
  Ids from a space much larger than the sample (hashes, sparse ids) fail 3
  and stay numeric; a dense, evenly spread quantity (days since sign-up)
  passes. Both are reported as ambiguous (``ambiguity``): every column made
  categorical by its values alone, and every one that fails 3 only (evenly
  spread, |skewness| <= MAX_SKEW; a heavy-tailed amount is plainly a
  quantity), so ``schema show`` points at them and ``--categorical`` /
  ``--numeric`` settle them.

Row ids (``row_id_reason``) are dropped, not kept as categories: a column with
a different value on every sampled row, no value missing, that is a category
(text, or ids by the rules above) from a sample of at least ``MIN_DISTINCT``
rows, or whole numbers under a row-id name (``ROW_ID_NAMES``: id, row,
index, ...) in a sample of any size. Each value then names one row, and an
embedding per row only memorises the training rows (issue 32: a kept row id
took DeepFM's training loss to 0.002 and its test log loss from 0.248 to
0.284). A number that measures something (kept numeric, not under a row-id
name) is never dropped for being unique. A category kept with more distinct
values than ``MEMORISED`` of its rows is warned about (``memorised``).
"""
from __future__ import annotations

import re

import numpy as np

ID_WORDS = frozenset({"id", "ids", "uid", "uuid", "guid", "code", "key", "zip", "zipcode", "postcode", "postal",
                      "hash", "sku", "isbn", "asin"})
# Things a glued lowercase "<thing>id" names (userid, movieid); "id" after anything else is a
# word of its own (paid, valid, squid), so only these prefixes count.
ID_OWNERS = frozenset({"user", "item", "movie", "product", "ad", "campaign", "customer", "session", "device",
                       "app", "site", "advertiser", "creative", "query", "doc", "order", "account", "category",
                       "shop", "store", "song", "artist", "book", "video", "page", "member", "client", "seller",
                       "brand", "event", "visitor", "publisher", "request"})
# Likewise a glued "<thing>code" (zipcode, countrycode); not encode, decode, unicode.
CODE_OWNERS = frozenset({"zip", "post", "postal", "area", "country", "state", "region", "city", "bar", "product",
                         "item", "promo", "coupon", "currency", "language", "lang", "airport", "station", "naics",
                         "sic", "icd", "hs", "status", "error", "reason"})
MIN_DISTINCT = 100
MIN_FILL = 0.5
MAX_SKEW = 1.5
MAX_MIDDLE = 0.7
ROW_ID_NAMES = frozenset({"id", "row", "rowid", "row_id", "row_no", "row_num", "rownum", "row_number", "index",
                          "idx", "unnamed: 0", ""})
MEMORISED = 0.5                  # a category with more distinct values than this share of its rows
AMBIGUOUS = "ambiguous: "        # how a note says the guess is doubtful (always its last clause)

_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def name_words(name: str) -> list[str]:
    """``user_id`` / ``movieId`` / ``userID`` / ``Zip-Code`` -> lowercase words, digits apart."""
    return [w.lower() for w in _WORD.findall(name)]


def id_name(name: str) -> str | None:
    """Why the name says the column holds ids (e.g. "name ends in 'id'"), or None."""
    words = [w for w in name_words(name) if not w.isdigit()]
    if not words:
        return None
    last = words[-1]
    if last in ID_WORDS:
        return f"its name ends in the word {last!r}"
    if len(words) == 1:
        if last.endswith("id") and last[:-2] in ID_OWNERS:
            return f"its name is {last[:-2]!r} + 'id'"
        if last.endswith("code") and last[:-4] in CODE_OWNERS:
            return f"its name is {last[:-4]!r} + 'code'"
    return None


def id_values(x: np.ndarray) -> tuple[str, str]:
    """(verdict, why) for present numbers ``x`` (float64, no NaN). The verdict: "ids" (all the
    signs hold), "maybe" (ids from a space larger than the sample would look like this: many
    whole numbers, evenly spread, but thin over their range) or "no"."""
    if not len(x) or not np.all(x == np.round(x)):
        return "no", "not all whole numbers"
    lo, hi = float(x.min()), float(x.max())
    if lo < 0:
        return "no", "negative values (a signed quantity)"
    distinct = len(np.unique(x))
    if distinct < MIN_DISTINCT:
        return "no", f"{distinct} distinct values (under {MIN_DISTINCT}: a small integer quantity)"
    skew = skewness(x)
    fill = distinct / (hi - lo + 1)
    if fill < MIN_FILL:
        return ("maybe" if abs(skew) <= MAX_SKEW else "no"), (
            f"{distinct} distinct values spread thin over {lo:.0f}..{hi:.0f} ({fill:.0%} of the range, "
            f"skewness {skew:.1f}: a measured quantity, or ids from a larger space)")
    middle = float(np.mean((x > lo + (hi - lo) / 4) & (x < hi - (hi - lo) / 4)))
    if abs(skew) > MAX_SKEW or middle > MAX_MIDDLE:
        return "no", (f"{distinct} distinct values bunched (skewness {skew:.1f}, {middle:.0%} of rows in the "
                      f"middle half of {lo:.0f}..{hi:.0f}: a quantity)")
    return "ids", (f"{distinct} distinct whole numbers filling {fill:.0%} of {lo:.0f}..{hi:.0f}, spread evenly "
                   f"(skewness {skew:.1f})")


def skewness(v: np.ndarray) -> float:
    std = v.std()
    return float(((v - v.mean()) ** 3).mean() / std ** 3) if std > 0 else 0.0


def with_doubt(note: str, doubt: str) -> str:
    """``note`` with ``doubt`` as its last clause, in the form ``ambiguity`` reads back."""
    return f"{note}; {AMBIGUOUS}{doubt}" if doubt else note


def without_doubt(note: str) -> str:
    """``note`` without its doubt (the user settled it: --categorical / --numeric)."""
    at = note.find(f"; {AMBIGUOUS}")
    return note[:at] if at >= 0 else note


def ambiguity(column) -> str:
    """Why a column's kind is doubtful, or "": the doubt ``schema infer`` wrote into the note,
    else a numeric column whose name says id (a hand-edited schema, or --numeric)."""
    at = column.note.find(AMBIGUOUS)
    if at >= 0:
        return column.note[at + len(AMBIGUOUS):]
    why = id_name(column.name) if column.kind == "numeric" else None
    return f"{why}, yet it is numeric" if why else ""


def row_id_reason(name: str, kind: str, distinct: int, rows: int, present: int, whole: bool) -> str:
    """Why a column inferred as ``kind`` is a row id to drop ("" if it is not): ``distinct``
    values among ``present`` non-missing of ``rows`` sampled rows; ``whole``: all whole numbers."""
    if present != rows or distinct != rows or rows < 2:
        return ""
    named = name.strip().lower() in ROW_ID_NAMES
    if kind == "categorical" and (named or rows >= MIN_DISTINCT):
        why = f"its name {name!r} names rows" if named else "a category"
    elif kind == "numeric" and named and whole:
        why = f"whole numbers under the name {name!r}"
    else:
        return ""
    return (f"a row id ({why}, every one of the {rows} sampled values different): each value names one row, "
            f"so it can only memorise the training rows, not teach anything about new ones; "
            f"to keep it, pass --categorical {name} (or --numeric {name})")


def memorised(name: str, distinct: int, present: int) -> str:
    """A warning when a kept category has too many distinct values to generalise from, or ""."""
    if present < MIN_DISTINCT or distinct <= MEMORISED * present:
        return ""
    return (f"column {name!r} has {distinct} distinct values in {present} sampled rows ({distinct / present:.0%}): "
            f"most values are seen about once, so the model will memorise them rather than learn; drop it "
            f"(--drop {name}) unless it names things that recur in new data, or set its min_count to 2 or more "
            f"in the schema (values rarer than that share one id)")
