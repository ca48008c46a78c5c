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
- a Parquet list column is multi-valued (``list_column: true``), its elements
  the bag in their order; ``multi=`` (``--multi COL:SEP``) makes a text
  column multi-valued with that separator;
- a column with a single value in the sample (always empty padding fields)
  is dropped: it can only become a constant;
- a row id (a different value on every row: id_columns.row_id_reason) is
  dropped, with the reason and how to keep it in its note; a category kept
  with distinct values for most rows is warned about (``Inferred.warnings``);
  ``drop=`` (``--drop``) drops the columns named;
- ``sequence=`` (``--sequence SEQ:CAND``) makes SEQ a behaviour sequence of
  the categorical CAND (one id space; DIN's input): sequences.py;
- the delimiter of a text file: ``delimiter=`` (``--delimiter``), else the
  header decides (frames.sniff_delimiter); it is recorded in the schema
  (``format.by_suffix: false``) so every later command reads the file alike;
- the label is --label, else a column named like one (label, click, target,
  y, ...). Its kind (``label_kind``; docs/data.md "Labels"):
  "binary": 0/1 or -1/+1 numbers; two values (yes/no, true/false: yes/true
  is 1; any other two: the larger number, or the rarer text, is 1);
  "regression": numbers with fractions, or whole numbers of more than
  MAX_CLASSES values (a price, a count); "multitask": ``--label a,b``, each a
  binary label. A multi-class label (text of 3+ values, whole numbers of at
  most MAX_CLASSES values) and a single-valued one are refused with the
  reason; ``label_kind=`` (``--label-kind binary|regression``) settles a
  guess (a 0..5 rating is a quantity: regression).
A guess that could well be wrong ends its note with "ambiguous: why"
(id_columns.ambiguity); ``schema show`` marks those columns.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from paramshard.errors import ConfigError
from paramshard.data.readers._reader import as_paths, read_blocks
from paramshard.data.features.encode import _number_text, as_text, missing_mask, parse_numbers
from paramshard.data.readers.frames import (delimiter_hint, file_format, iter_frames, open_parquet, parse_delimiter,
                                            sniff_delimiter)
from paramshard.data.features.id_columns import (id_name, id_values, memorised, row_id_reason, skewness, with_doubt,
                                                 without_doubt)
from paramshard.data.features.names import did_you_mean
from paramshard.data.features.sequences import apply_sequences, sequence_items
from paramshard.specs.schema import DEFAULT_MISSING, Column, Format, Label, Schema

SAMPLE_ROWS = 20000
LABEL_NAMES = ("label", "click", "clicked", "target", "y", "is_click", "income", "class", "outcome")
MULTI_SEPARATORS = ("|", ";")
SKEWED = 2.0
# Numbers also become quantile-bucket ids, so the model can learn a shape per range (an age
# effect that rises then falls) that one linear weight cannot; the standardized value stays.
BUCKETS = 10
# Two label values that name their positive one, whichever is rarer.
AFFIRMATIVE = {frozenset(pair): pair[0] for pair in (("yes", "no"), ("true", "false"), ("y", "n"), ("t", "f"),
                                                     ("positive", "negative"), ("pos", "neg"))}
MAX_CLASSES = 20     # whole-number labels with at most this many values read as classes, more as a quantity
SUPPORTED_LABELS = ("the CTR app supports binary labels: 0/1 (or -1/+1) numbers, or a column with two distinct "
                    "values (yes/no, true/false: yes/true is 1; any other two: the larger number or the rarer text "
                    "is 1, or set label.positive / label.negative in the schema); real-valued labels (regression, "
                    "--label-kind regression); and several binary labels (multi-task, --label a,b)")
LABEL_KINDS = ("binary", "regression")


@dataclass
class Inferred:
    schema: Schema
    warnings: list = field(default_factory=list)      # lines for the user (columns likely memorised)

    @property
    def dropped(self) -> list:
        """(name, note) of the columns infer dropped."""
        return [(c.name, c.note) for c in self.schema.columns if c.kind == "drop"]


def sniff_format(path: Path, delimiter: str | None = None) -> Format:
    """The file's format; a text file's delimiter is ``delimiter`` (--delimiter) if given, else
    the one its header and first rows agree on (frames.sniff_delimiter). Recorded with
    by_suffix false: later commands read every file with it, whatever its suffix."""
    kind, _ = file_format(path, Format())
    if kind == "parquet":
        return Format(type="parquet", header=True)
    head = next(read_blocks(path, 1 << 16), b"").decode("utf-8", "replace")
    lines = [ln for ln in head.splitlines()[:50] if ln]
    if not lines:
        raise ConfigError(f"{path}: empty file, nothing to infer a schema from")
    delimiter = parse_delimiter(delimiter) if delimiter else sniff_delimiter(lines)
    rows = list(csv.reader(lines, delimiter=delimiter))
    header = _looks_like_header(rows)
    names = [] if header else [f"c{i}" for i in range(len(rows[0]))]
    return Format(type="tsv" if delimiter == "\t" else "csv", delimiter=delimiter, header=header, names=names,
                  by_suffix=False)


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
                 categorical=(), numeric=(), drop=(), multi=(), delimiter: str | None = None,
                 label_kind: str | None = None, sequence=()) -> Schema:
    """A schema for the file at ``path`` from its first ``sample_rows`` rows (``infer`` has the
    arguments; this is its schema alone)."""
    return infer(path, label, sample_rows, categorical, numeric, drop, multi, delimiter, label_kind, sequence).schema


def infer(path, label: str | None = None, sample_rows: int = SAMPLE_ROWS, categorical=(), numeric=(), drop=(),
          multi=(), delimiter: str | None = None, label_kind: str | None = None, sequence=()) -> Inferred:
    """The schema and the warnings for the file at ``path`` from its first ``sample_rows`` rows.
    The columns named in ``categorical`` / ``numeric`` get that kind whatever the guess, those in
    ``drop`` are dropped, ``multi`` ("COL:SEP" items) are split on SEP; ``delimiter`` overrides
    the sniffed one; ``sequence`` ("SEQ:CAND" items) marks behaviour sequences (sequences.py).
    ``label`` may name several binary labels ("click,buy": multi-task); ``label_kind``
    ("binary" / "regression") overrules the label's guessed kind."""
    if label_kind is not None and label_kind not in LABEL_KINDS:
        raise ConfigError(f"--label-kind {label_kind!r}: one of {', '.join(LABEL_KINDS)} (several binary labels: "
                          f"--label a,b)")
    pairs = sequence_items(sequence)
    path = as_paths(path)[0]
    fmt = sniff_format(path, delimiter)
    names = _names(path, fmt)
    columns: dict[str, list[np.ndarray]] = {n: [] for n in names}
    taken, bad = 0, []
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
    guessed = not label
    named: list[str | None] = [*_listed(label)] or [next((n for n in names if n.lower() in LABEL_NAMES), None)]
    for one in named:
        if one is None or one not in names:
            what = f"no column {one!r}{did_you_mean(one, names)}" if one else "no column looks like the label"
            raise ConfigError(f"{path}: {what}; pass --label COLUMN (columns: {', '.join(names)})"
                              f"{delimiter_hint(names, fmt.delimiter) if fmt.type != 'parquet' else ''}")
    wanted = [one for one in named if one is not None]      # every one of them: a None raised above
    if len(set(wanted)) != len(wanted):
        raise ConfigError(f"--label {label}: a column is named twice")
    if len(wanted) > 1 and label_kind == "regression":
        raise ConfigError(f"--label {label} --label-kind regression: several labels are multi-task binary labels; "
                          f"a regression has one label")
    forced = _overrides(names, wanted, categorical, numeric, drop, multi)
    missing = frozenset(fmt.missing)
    warnings: list[str] = []
    out = [_inferred(n, sample[n], missing, forced.get(n), warnings) for n in names if n not in wanted]
    if pairs:
        out = apply_sequences(out, pairs, names, wanted, forced)
    targets = []
    for one in wanted:
        try:
            target, kind = _label(path, one, sample[one], missing, "binary" if len(wanted) > 1 else label_kind)
        except ConfigError as exc:
            if not guessed:
                raise ConfigError(f"{exc} (one of the multi-task labels {label}: each must be binary)"
                                  if len(wanted) > 1 else str(exc)) from None
            raise ConfigError(f"{exc} (the label {one!r} was a guess from its name: pass --label COLUMN to "
                              f"name the label)") from None
        targets.append(target)
    if len(targets) > 1:
        schema = Schema(label=targets[0], columns=out, format=fmt, label_kind="multitask", labels=targets)
    else:
        schema = Schema(label=targets[0], columns=out, format=fmt, label_kind=kind)
    return Inferred(schema, warnings)


def _inferred(name: str, raw: np.ndarray, missing: frozenset, kind, warnings: list) -> Column:
    """The column (forced, or guessed then dropped if it is a row id); a warning appended when a
    kept category has too many values to generalise from."""
    col = _forced(name, raw, missing, kind)
    if col.kind not in ("categorical", "numeric") or (col.kind == "numeric" and kind is not None):
        return col
    miss = missing_mask(raw, missing)
    distinct = len(np.unique(as_text(raw[~miss])))
    present = int((~miss).sum())
    if kind is None:
        x, not_number = parse_numbers(raw, miss)
        whole = not not_number.any() and bool(np.all(x[~miss] == np.round(x[~miss])))
        why = row_id_reason(name, col.kind, distinct, len(raw), present, whole)
        if why:
            return Column(name, "drop", note=f"dropped: {why}")
    warning = memorised(name, distinct, present) if col.kind == "categorical" else ""
    if warning:
        warnings.append(warning)
    return col


def _no_rows(path: Path, fmt: Format, names: list[str], bad: list) -> str:
    if bad:
        line, reason = bad[0]
        return (f"{path}: none of the first rows could be read (line {line}: {reason}); check format.delimiter "
                f"({fmt.delimiter!r}) and that every line has the header's {len(names)} columns")
    if fmt.header:
        return (f"{path} has a header ({', '.join(names)}) but no data rows: nothing to infer a schema from; "
                f"point infer at a file with data")
    return f"{path}: no data rows, nothing to infer a schema from"


def _overrides(names: list[str], labels: list[str], categorical, numeric, drop=(), multi=()) -> dict[str, str]:
    """{column: kind} from --categorical / --numeric / --drop / --multi (kind "multi:SEP"), every
    name checked against the file, each column named once."""
    separators = _multi_items(multi)
    asked = {"--categorical": _listed(categorical), "--numeric": _listed(numeric), "--drop": _listed(drop),
             "--multi": list(separators)}
    for flag, listed in asked.items():
        for n in listed:
            if n not in names:
                raise ConfigError(f"{flag} {n}: no such column{did_you_mean(n, names)} "
                                  f"(columns: {', '.join(names)})")
            if n in labels:
                raise ConfigError(f"{flag} {n}: that is the label column; it is not a feature (pass another "
                                  f"--label to change it)")
    flags = list(asked)
    for i, a in enumerate(flags):
        for b in flags[i + 1:]:
            both = sorted(set(asked[a]) & set(asked[b]))
            if both:
                raise ConfigError(f"column {both[0]!r} is in both {a} and {b}: choose one")
    out = {n: flag[2:] for flag in ("--categorical", "--numeric", "--drop") for n in asked[flag]}
    out.update({n: f"multi:{sep}" for n, sep in separators.items()})
    return out


def _multi_items(multi) -> dict[str, str]:
    """{column: separator} from "COL:SEP" items (a list, or one string)."""
    items = [multi] if isinstance(multi, str) else list(multi or ())
    out = {}
    for item in items:
        name, colon, sep = item.partition(":")
        if not colon or not name.strip() or not sep:
            raise ConfigError(f"--multi {item!r}: expected COLUMN:SEPARATOR, e.g. tags:| or genres:;")
        out[name.strip()] = sep
    return out


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


def _label(path: Path, name: str, raw: np.ndarray, missing: frozenset, kind: str | None = None) -> tuple[Label, str]:
    """(the label, its kind: "binary" or "regression"), or a ConfigError saying why the column
    is neither (SUPPORTED_LABELS). ``kind`` (--label-kind) settles an ambiguous guess."""
    miss = missing_mask(raw, missing)
    x, not_number = parse_numbers(raw, miss)
    text = as_text(raw[~miss])
    values, counts = np.unique(text, return_counts=True) if len(text) else (np.empty(0, object), np.empty(0))
    where = f"{path}: label column {name!r}"
    if not not_number.any():
        numbers = np.unique(x[~miss])
        if kind == "regression":
            if len(numbers) < 2:
                raise ConfigError(f"{where} has one value only ({', '.join(map(str, values[:1])) or 'none'}) in the "
                                  f"first {len(raw)} rows: nothing to learn; {SUPPORTED_LABELS}")
            return Label(column=name), "regression"
        if set(numbers.tolist()) <= {0.0, 1.0} or set(numbers.tolist()) <= {-1.0, 1.0}:
            return Label(column=name), "binary"
        if len(numbers) == 2 and len(values) == 2:      # e.g. 1/2: the larger is 1
            hi = int(np.argmax(parse_numbers(values.astype(object), np.zeros(2, bool))[0]))
            return Label(column=name, positive=[str(values[hi])], negative=[str(values[1 - hi])]), "binary"
        whole = bool(np.all(numbers == np.round(numbers)))
        shown = ", ".join(_number_text(float(v)) for v in numbers[:5])
        classes = whole and len(numbers) <= MAX_CLASSES
        if classes:
            raise ConfigError(f"{where} is a multi-class label ({len(numbers)} classes in the first {len(raw)} rows: "
                              f"{shown}, ...): if the values are a quantity (a 0..5 rating, a count), pass "
                              f"--label-kind regression, else make it binary in the file (e.g. 1 where it exceeds a "
                              f"threshold), or pass another --label; {SUPPORTED_LABELS}")
        if kind == "binary":
            raise ConfigError(f"{where} is a continuous label ({len(numbers)} distinct values in the first "
                              f"{len(raw)} rows, e.g. {shown}), not binary as --label-kind binary says; make it "
                              f"binary in the file (e.g. 1 where it exceeds a threshold), or leave --label-kind "
                              f"out to train a regression")
        return Label(column=name), "regression"
    if kind == "regression":
        bad = raw[not_number][0]
        raise ConfigError(f"{where} is not a number (e.g. {bad!r}): --label-kind regression needs a numeric label")
    if len(values) != 2:
        shown = ", ".join(map(str, values[:5]))
        what = (f"a multi-class label ({len(values)} distinct values in the first {len(raw)} rows: {shown}, ...)"
                if len(values) > 2 else f"one value only ({shown or 'none'}) in the first {len(raw)} rows")
        raise ConfigError(f"{where} has {what}; {SUPPORTED_LABELS}")
    pair = [str(v) for v in values]
    positive = AFFIRMATIVE.get(frozenset(v.lower() for v in pair))
    pos = next(i for i, v in enumerate(pair) if v.lower() == positive) if positive else int(np.argmin(counts))
    return Label(column=name, positive=[pair[pos]], negative=[pair[1 - pos]]), "binary"


def _forced(name: str, raw: np.ndarray, missing: frozenset, kind: str | None) -> Column:
    """The inferred column, or the kind the user asked for with the guess kept in the note."""
    guess = _column(name, raw, missing)
    if kind is None:
        return guess
    flag = f"--{kind}".partition(":")[0]
    inferred = f"the guess was {guess.kind}: {without_doubt(guess.note)}"
    if kind == "drop":
        return Column(name, "drop", note=f"{flag} on the command line ({inferred})")
    if guess.list_column:
        raise ConfigError(f"{flag} {name}: it is a list column (a list per cell): it is read as a bag of its "
                          f"elements (kind multi); leave it, or --drop it")
    if kind.startswith("multi:"):
        sep = kind.partition(":")[2]
        return Column(name, "multi", separator=sep, note=f"{flag} {name}:{sep} on the command line ({inferred})")
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
    if any(isinstance(v, (tuple, list)) for v in present[:1000]):
        return Column(name, "multi", list_column=True,
                      note="a list column (a list per cell): a bag of its elements, in the list's order")
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
    return Column(name, "categorical", note=note)


def _number_column(name: str, v: np.ndarray, miss: np.ndarray) -> Column:
    """Numbers: ids (by name, or by values) are categorical, the rest numeric."""
    whole = bool(np.all(v == np.round(v)))
    distinct = len(np.unique(v))
    why_name = id_name(name)
    if why_name and whole:
        note = f"whole numbers, but {why_name}: ids, one category per value ({distinct} distinct in the sample)"
        return Column(name, "categorical", note=note)
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
