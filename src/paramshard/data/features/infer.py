"""A first schema from a look at a file's first rows (``paramshard schema infer``).

The guesses, each written into the column's ``note`` so the user can see why
and edit the file:
- a column whose present values all parse as numbers is numeric:
  "standardize", preceded by "log" when it is heavy-tailed (skewness > 2, as
  counts and amounts are), a missing indicator when any value is missing,
  and 10 quantile buckets as one more id field when it has more than 10
  distinct values;
- but numbers that are ids (a name such as ``user_id``, ``movieId``,
  ``zip_code``; or whole numbers filling a dense, evenly spread range) are
  categorical: one embedding row per value, not a slope over arbitrary
  labels. The rules and their reasons are in data/features/id_columns.py;
- anything else is categorical, or multi-valued when most of its cells hold
  one of the usual list separators (``|``, ``;``);
- ``categorical=`` / ``numeric=`` (``--categorical`` / ``--numeric``) overrule
  the guess for the columns named, and the note says so;
- a column with a single value in the sample (always empty padding fields)
  is dropped: it can only become a constant;
- the label is --label, else a column named like one (label, click, target,
  y, ...); a text label with two values maps the rarer one to 1.
A guess that could well be wrong ends its note with "ambiguous: why"
(id_columns.ambiguity); ``schema show`` marks those columns.
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from paramshard.errors import ConfigError
from paramshard.data.readers._reader import as_paths, read_blocks
from paramshard.data.features.encode import as_text, missing_mask, parse_numbers
from paramshard.data.readers.frames import file_format, iter_frames, open_parquet
from paramshard.data.features.id_columns import MIN_DISTINCT, id_name, id_values, skewness, with_doubt, without_doubt
from paramshard.data.features.names import did_you_mean
from paramshard.specs.schema import DEFAULT_MISSING, Column, Format, Label, Schema

SAMPLE_ROWS = 20000
LABEL_NAMES = ("label", "click", "clicked", "target", "y", "is_click", "income", "class", "outcome")
MULTI_SEPARATORS = ("|", ";")
SKEWED = 2.0
# Numbers also become quantile-bucket ids, so the model can learn a shape per range (an age
# effect that rises then falls) that one linear weight cannot; the standardized value stays.
BUCKETS = 10


def sniff_format(path: Path) -> Format:
    kind, delimiter = file_format(path, Format())
    if kind == "parquet":
        return Format(type="parquet", header=True)
    head = next(read_blocks(path, 1 << 16), b"").decode("utf-8", "replace")
    lines = [ln for ln in head.splitlines()[:50] if ln]
    if not lines:
        raise ConfigError(f"{path}: empty file, nothing to infer a schema from")
    if not path.name.lower().removesuffix(".gz").endswith((".csv", ".tsv")):
        delimiter = "\t" if lines[0].count("\t") >= max(1, lines[0].count(",")) else ","
    rows = list(csv.reader(lines, delimiter=delimiter))
    header = _looks_like_header(rows)
    names = [] if header else [f"c{i}" for i in range(len(rows[0]))]
    return Format(type="tsv" if delimiter == "\t" else "csv", delimiter=delimiter, header=header, names=names)


def _looks_like_header(rows: list[list[str]]) -> bool:
    """A header names columns: none of its cells is a number, and below it some
    column is numeric or its first cell appears nowhere else in that column."""
    first, rest = rows[0], rows[1:]
    if any(_is_number(v) for v in first):
        return False
    for i, name in enumerate(first):
        below = [r[i] for r in rest if i < len(r)]
        if below and (all(_is_number(v) or v.strip() in DEFAULT_MISSING for v in below) or name not in below):
            return True
    return not rest


def _is_number(v: str) -> bool:
    try:
        float(v)
        return True
    except ValueError:
        return False


def infer_schema(path, label: str | None = None, sample_rows: int = SAMPLE_ROWS,
                 categorical=(), numeric=()) -> Schema:
    """A schema for the file at ``path`` from its first ``sample_rows`` rows; the columns
    named in ``categorical`` / ``numeric`` get that kind whatever the guess."""
    path = as_paths(path)[0]
    fmt = sniff_format(path)
    names = _names(path, fmt)
    columns, taken, bad = {n: [] for n in names}, 0, []
    for frame in iter_frames(path, fmt, names):
        for n in names:
            columns[n].append(frame.columns[n])
        taken += len(frame)
        bad += frame.bad[:1]
        if taken >= sample_rows:
            break
    if taken == 0:
        raise ConfigError(_no_rows(path, fmt, names, bad))
    sample = {n: np.concatenate(v)[:sample_rows] if v else np.empty(0, object) for n, v in columns.items()}
    label = label or next((n for n in names if n.lower() in LABEL_NAMES), None)
    if label is None or label not in names:
        what = f"no column {label!r}{did_you_mean(label, names)}" if label else "no column looks like the label"
        raise ConfigError(f"{path}: {what}; pass --label COLUMN (columns: {', '.join(names)})")
    forced = _overrides(names, label, categorical, numeric)
    missing = frozenset(fmt.missing)
    return Schema(label=_label(label, sample[label], missing),
                  columns=[_forced(n, sample[n], missing, forced.get(n)) for n in names if n != label], format=fmt)


def _no_rows(path: Path, fmt: Format, names: list[str], bad: list) -> str:
    if bad:
        line, reason = bad[0]
        return (f"{path}: none of the first rows could be read (line {line}: {reason}); check format.delimiter "
                f"({fmt.delimiter!r}) and that every line has the header's {len(names)} columns")
    if fmt.header:
        return (f"{path} has a header ({', '.join(names)}) but no data rows: nothing to infer a schema from; "
                f"point infer at a file with data")
    return f"{path}: no data rows, nothing to infer a schema from"


def _overrides(names: list[str], label: str, categorical, numeric) -> dict[str, str]:
    """{column: kind} from --categorical / --numeric, every name checked against the file."""
    categorical, numeric = _listed(categorical), _listed(numeric)
    for flag, asked in (("--categorical", categorical), ("--numeric", numeric)):
        for n in asked:
            if n not in names:
                raise ConfigError(f"{flag} {n}: no such column{did_you_mean(n, names)} "
                                  f"(columns: {', '.join(names)})")
            if n == label:
                raise ConfigError(f"{flag} {n}: that is the label column; it is not a feature")
    both = sorted(set(categorical) & set(numeric))
    if both:
        raise ConfigError(f"column {both[0]!r} is in both --categorical and --numeric: choose one")
    return {**{n: "categorical" for n in categorical}, **{n: "numeric" for n in numeric}}


def _listed(value) -> list[str]:
    """Column names from a comma list ("a,b") or a sequence of names (each may be a comma list)."""
    items = [value] if isinstance(value, str) else list(value or ())
    return [n.strip() for item in items for n in item.split(",") if n.strip()]


def _names(path: Path, fmt: Format) -> list[str]:
    if fmt.names:
        return list(fmt.names)
    if fmt.type == "parquet":
        return list(open_parquet(path).schema_arrow.names)
    head = next(read_blocks(path, 1 << 16)).decode("utf-8", "replace").splitlines()[0]
    return [n.strip() for n in next(csv.reader([head], delimiter=fmt.delimiter))]


def _label(name: str, raw: np.ndarray, missing: frozenset) -> Label:
    miss = missing_mask(raw, missing)
    x, not_number = parse_numbers(raw, miss)
    if not not_number.any():
        return Label(column=name)
    values, counts = np.unique(as_text(raw[~miss]), return_counts=True)
    if len(values) != 2:
        raise ConfigError(f"label column {name!r} has {len(values)} distinct values in the first rows "
                          f"({', '.join(map(str, values[:5]))}...): a binary label needs two (or numbers); "
                          f"edit label.positive / label.negative in the schema")
    rare = int(np.argmin(counts))
    return Label(column=name, positive=[str(values[rare])], negative=[str(values[1 - rare])])


def _forced(name: str, raw: np.ndarray, missing: frozenset, kind: str | None) -> Column:
    """The inferred column, or the kind the user asked for with the guess kept in the note."""
    guess = _column(name, raw, missing)
    if kind is None:
        return guess
    flag = f"--{kind}"
    inferred = f"the guess was {guess.kind}: {without_doubt(guess.note)}"
    if kind == "categorical":
        return Column(name, "categorical", note=f"{flag} on the command line ({inferred})")
    miss = missing_mask(raw, missing)
    x, not_number = parse_numbers(raw, miss)
    if not_number.any():
        raise ConfigError(f"{flag} {name}: its values are not all numbers (e.g. {raw[not_number][0]!r}); "
                          f"a numeric column needs numbers")
    col = _numeric(name, x[~miss], miss)
    why = id_name(name)
    was = "" if guess.kind == "numeric" else f" ({inferred})"
    col.note = with_doubt(f"{flag} on the command line{was}; {col.note}",
                          f"{why}, yet {flag} made it numeric" if why else "")
    return col


def _column(name: str, raw: np.ndarray, missing: frozenset) -> Column:
    miss = missing_mask(raw, missing)
    present = raw[~miss]
    if len(np.unique(as_text(present))) <= 1:
        return Column(name, kind="drop", note="one value (or none) in the sample: it would be a constant")
    x, not_number = parse_numbers(raw, miss)
    if not not_number.any():
        return _number_column(name, x[~miss], miss)
    text = as_text(present)
    for sep in MULTI_SEPARATORS:
        if np.mean([sep in t for t in text]) > 0.5:
            return Column(name, "multi", separator=sep, note=f"most cells hold several values split by {sep!r}")
    distinct = len(np.unique(text))
    note = f"text; {distinct} distinct values in {len(raw)} sampled rows"
    why = id_name(name)
    note += f"; {why}: ids" if why else ""
    return Column(name, "categorical", note=with_doubt(note, _row_id_doubt(distinct, len(present))))


def _number_column(name: str, v: np.ndarray, miss: np.ndarray) -> Column:
    """Numbers: ids (by name, or by values) are categorical, the rest numeric."""
    whole = bool(np.all(v == np.round(v)))
    distinct = len(np.unique(v))
    why_name = id_name(name)
    if why_name and whole:
        note = f"whole numbers, but {why_name}: ids, one category per value ({distinct} distinct in the sample)"
        return Column(name, "categorical", note=with_doubt(note, _row_id_doubt(distinct, len(v))))
    verdict, why_values = id_values(v)
    if verdict == "ids":
        return Column(name, "categorical", note=with_doubt(
            f"{why_values}: sequential ids, one category per value",
            f"ids by their values alone (no id name); pass --numeric {name} if their order means something"))
    col = _numeric(name, v, miss)
    if why_name:
        doubt = f"{why_name}, but it holds fractional numbers, so it stays numeric"
    elif verdict == "maybe":
        doubt = f"whole numbers kept numeric: {why_values}; pass --categorical {name} if they are ids"
    else:
        doubt = ""
    col.note = with_doubt(col.note, doubt)
    return col


def _numeric(name: str, v: np.ndarray, miss: np.ndarray) -> Column:
    skew = skewness(v)
    transforms = ["log", "standardize"] if skew > SKEWED else ["standardize"]
    distinct = len(np.unique(v))
    buckets = BUCKETS if distinct > BUCKETS else 0
    return Column(name, "numeric", transforms=transforms, missing_indicator=bool(miss.any()), bucketize=buckets,
                  note=f"numbers; skewness {skew:.1f}" + (" (heavy tail: log first)" if skew > SKEWED else "")
                  + (f"; {distinct} distinct values: also {BUCKETS} quantile buckets as an id field"
                     if buckets else ""))


def _row_id_doubt(distinct: int, present: int) -> str:
    if present >= MIN_DISTINCT and distinct == present:
        return ("every sampled value is different: if it names the row itself, it can teach the model nothing "
                "about other rows (set kind: drop)")
    return ""
