"""JSON rows -> the model's inputs, encoded as `paramshard predict` encodes a file's rows.

A request's rows are objects keyed by the schema's column names (the label column may be absent
and is ignored; other keys are ignored, as `paramshard predict` ignores a file's other columns).
A missing key or ``null`` is a missing value. Values: a string (as a CSV cell holds it), a number
(as a Parquet file's number: a numeric column's value, or a category read as its text, ``3`` and
``3.0`` both "3"), or, for a multi-valued column, a list of strings and numbers (its bag; a
string is split on the column's separator as in a file). Booleans, objects and nested lists are
refused. Columnar form (``/predict/batch``): {column: [value per row]}, every list the same length.

Everything is checked before anything is allocated for it beyond the parsed JSON (the HTTP front
caps the body's bytes, so the parsed JSON is bounded too): the row count, each row's shape and
each value's type. A problem is a ``BadRequest`` naming the row and column.

``batch_of_rows`` / ``batch_of_columns`` encode a request's parsed JSON at once, through the
fast path (serving/fast_rows.py: no pandas, the same batch bit for bit) and, for what it does not
take, through ``from_rows``/``from_columns`` and ``encode`` (the schema Encoder's).
"""
from __future__ import annotations

import itertools
import operator

import numpy as np

from paramshard.errors import ParamshardError

MAX_ROWS = 10_000          # rows of one request (a batch request: all its requests together)
MAX_BAG = 1_000            # values of one multi-valued cell


class BadRequest(ParamshardError):
    """A request that is not what the endpoint reads: the reply says why (HTTP 400)."""


def _scalar(v) -> bool:
    return v is None or isinstance(v, str) or (isinstance(v, (int, float)) and not isinstance(v, bool))


class RowEncoder:
    def __init__(self, module, where):
        from paramshard.inference.scoring import schema_of
        self._setup(schema_of(module, where))

    @classmethod
    def of_schema(cls, schema) -> "RowEncoder":
        self = cls.__new__(cls)
        self._setup(schema)
        return self

    def _setup(self, schema) -> None:
        from paramshard.data.features.encode import Encoder
        from paramshard.serving.fast_rows import FastEncoder

        self.schema = schema
        self.columns = [c for c in self.schema.columns if c.kind != "drop"]
        self.kinds = {c.name: c.kind for c in self.columns}
        # A row's values of every column, in order (None with one column: itemgetter then gives no tuple).
        self._cells = operator.itemgetter(*self.kinds) if len(self.kinds) > 1 else None
        self._encoder = Encoder(self.schema, labels=False)
        self.fast = FastEncoder(self)

    def batch_of_rows(self, rows):
        """The TabularBatch of a list of row objects (``encode(from_rows(rows))``, faster)."""
        from paramshard.serving.fast_rows import Fallback
        if type(rows) is list and 0 < len(rows) <= MAX_ROWS and set(map(type, rows)) == {dict}:
            n = len(rows)
            try:
                try:     # every row has every column (the usual request): one C call per row, then transposed
                    columns = dict(zip(self.kinds, zip(*map(self._cells, rows)))) if self._cells else None
                except KeyError:
                    columns = None
                if columns is None:      # a missing key is a missing value
                    columns = {name: list(map(dict.get, rows, itertools.repeat(name, n))) for name in self.kinds}
                return self.fast.encode(columns, n)
            except Fallback:
                pass
        self.fast.fallbacks += 1
        return self.encode(self.from_rows(rows))

    def batch_of_columns(self, columns):
        """The TabularBatch of a {column: [values]} object (``encode(from_columns(columns))``, faster)."""
        from paramshard.serving.fast_rows import Fallback
        if type(columns) is dict and all(type(v) is list for v in columns.values()):
            lengths = {len(v) for v in columns.values()}
            n = next(iter(lengths), 0)
            if len(lengths) == 1 and 0 < n <= MAX_ROWS:
                try:
                    return self.fast.encode({name: columns[name] if name in columns else [None] * n
                                            for name in self.kinds}, n)
                except Fallback:
                    pass
        self.fast.fallbacks += 1
        return self.encode(self.from_columns(columns))

    def from_rows(self, rows) -> dict[str, np.ndarray]:
        """Columns of a list of row objects."""
        if not isinstance(rows, list):
            raise BadRequest(f"rows: expected a list of objects keyed by column name, got {type(rows).__name__}")
        check_count(len(rows))
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise BadRequest(f"row {i}: expected an object keyed by column name, got {type(row).__name__}")
        return {name: self._column(name, [row.get(name) for row in rows], "row {i}") for name in self.kinds}

    def from_columns(self, columns) -> dict[str, np.ndarray]:
        """Columns of a {column: [values]} object (missing columns: every value missing)."""
        if not isinstance(columns, dict):
            raise BadRequest(f"columns: expected an object column -> list of values, got {type(columns).__name__}")
        lengths = {name: len(v) for name, v in columns.items() if isinstance(v, list)}
        bad = [name for name, v in columns.items() if not isinstance(v, list)]
        if bad:
            raise BadRequest(f"columns: column {bad[0]!r} is not a list of values")
        if len(set(lengths.values())) > 1:
            raise BadRequest(f"columns: the lists differ in length ({', '.join(f'{k}: {n}' for k, n in lengths.items())})")
        n = next(iter(lengths.values()), 0)
        check_count(n)
        return {name: self._column(name, columns.get(name, [None] * n), "value {i}") for name in self.kinds}

    def _column(self, name: str, values: list, at: str) -> np.ndarray:
        kind = self.kinds[name]
        out = np.empty(len(values), object)
        for i, v in enumerate(values):
            if kind == "multi" and isinstance(v, list):
                if len(v) > MAX_BAG or not all(_scalar(x) and x is not None for x in v):
                    raise BadRequest(f"{at.format(i=i)}, column {name!r}: a multi-valued cell is a list of at most "
                                     f"{MAX_BAG} strings or numbers")
                v = tuple(v)         # a bag, as a Parquet list cell is read (hashable: values are factorized)
            elif not _scalar(v):
                raise BadRequest(f"{at.format(i=i)}, column {name!r}: {type(v).__name__} is not a value (a string, a "
                                 f"number or null{'; a list for a multi-valued column' if kind == 'multi' else ''})")
            # A numeric column parses text (data/features/encode.py): a JSON number as its exact repr.
            out[i] = repr(float(v)) if kind == "numeric" and isinstance(v, (int, float)) else v
        return out

    def encode(self, columns: dict[str, np.ndarray]):
        """The TabularBatch of every row; BadRequest naming the first row that does not encode."""
        batch, bad = self._encoder.encode(columns)
        if bad:
            row, reason = bad[0]
            raise BadRequest(f"row {row}: {reason}" + (f" (and {len(bad) - 1} more rows)" if len(bad) > 1 else ""))
        return batch


def check_count(n: int) -> None:
    if n > MAX_ROWS:
        raise BadRequest(f"{n} rows: at most {MAX_ROWS} in one request (split it)")
    if n == 0:
        raise BadRequest("no rows to score")
