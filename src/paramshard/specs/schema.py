"""A table's columns and what becomes of each: the contract between a user's
file and a model.

A schema names the label, the numeric columns (with their transforms), the
categorical columns (hashed to ids, one field each), the multi-valued ones
(a separator splits them into a bag of ids) and the columns to drop. It is a
JSON or YAML file the user can read and edit: ``paramshard schema infer``
writes a first one from a sample, ``paramshard schema fit`` adds the
statistics the transforms need (means, quantiles, vocabularies), computed
once over the training data so every trainer transforms alike.

What a reader makes of a row (data/features/encode.py):
- dense features: per numeric column its transformed value, then its missing
  indicator if asked for; ``num_dense`` of them in schema order;
- fields: per categorical or multi-valued column one bag of ids, per
  bucketized numeric column one id; ``num_fields`` of them in schema order.
  A bag keeps its values in the order of the cell (``a|b|c``, or a Parquet
  list), so an ordered sequence (a user's behaviour history) stays ordered.
  A multi column with ``sequence_of: CAND`` is a behaviour sequence of the
  categorical column CAND: its values are hashed as CAND's are (one id space,
  one set of table rows), which DIN (models/din.py) compares position by
  position with CAND's value.

Supported labels (``label_kind``; docs/data.md "Labels"):
- "binary": 0/1 (or -1/+1) numbers or two values named in ``label.positive`` /
  ``label.negative``; a schema without ``label_kind`` (written before it
  existed) is binary;
- "regression": a real-valued number; ``schema fit`` writes its mean and std
  into ``label.stats`` (the models train on the standardised label and
  predict in the label's units: models/heads.py);
- "multitask": several binary labels, ``labels`` (each a label as above),
  ``label`` being the first of them (so a reader of ``label`` alone still
  finds a column). A single-label schema has no ``labels`` key.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from paramshard.errors import ConfigError

KINDS = ("numeric", "categorical", "multi", "drop")
TRANSFORMS = ("log", "standardize")
FORMATS = ("csv", "tsv", "parquet", "libsvm")
DEFAULT_MISSING = ("", "?", "NA", "N/A", "NaN", "nan", "null", "NULL", "None")
LABEL_KINDS = ("binary", "regression", "multitask")
VERSION = 1


@dataclass
class Column:
    name: str
    kind: str = "numeric"
    # numeric: transforms in order ("log": sign(x)*log1p(|x|); "standardize": (x - mean) / std,
    # last if present); bucketize: n quantile buckets as one more field; dense: False keeps
    # only the buckets; missing_indicator: one more dense feature, 1.0 where the value is missing.
    transforms: list = field(default_factory=list)
    bucketize: int = 0
    dense: bool = True
    missing_indicator: bool = False
    # categorical / multi: values seen fewer than min_count times in the fitted data share one id.
    min_count: int = 1
    separator: str = "|"              # multi only
    # multi only: the file holds a list per cell (a Parquet list column) rather than text the
    # separator splits; its elements are the bag, in the list's order.
    list_column: bool = False
    # multi only: this column is an ordered behaviour sequence (oldest first) of the named
    # categorical column, its candidate (``hist_item_ids`` of ``item_id``): its values are hashed
    # in the candidate's id space, so a value has the same id, and the same rows of every table,
    # in both columns; DIN attends over it with that column as the query. "" (older files): none.
    sequence_of: str = ""
    stats: dict | None = None         # written by `paramshard schema fit`
    note: str = ""                    # why infer chose this (for the reader of the file)

    def validate(self) -> None:
        where = f"schema column {self.name!r}"
        if self.kind not in KINDS:
            raise ConfigError(f"{where}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.kind == "numeric":
            bad = [t for t in self.transforms if t not in TRANSFORMS]
            if bad:
                raise ConfigError(f"{where}: unknown transform {bad[0]!r} (known: {', '.join(TRANSFORMS)}; "
                                  f"buckets are `bucketize: N`)")
            if "standardize" in self.transforms[:-1] or len(set(self.transforms)) != len(self.transforms):
                raise ConfigError(f"{where}: transforms {self.transforms}: each at most once, standardize last")
            if not isinstance(self.bucketize, int) or self.bucketize < 0 or self.bucketize == 1:
                raise ConfigError(f"{where}: bucketize must be 0 (off) or a number of buckets >= 2")
            if not self.dense and not self.bucketize:
                raise ConfigError(f"{where}: dense: false needs bucketize, or the column adds nothing "
                                  f"(use kind: drop to ignore it)")
        if self.kind in ("categorical", "multi") and (not isinstance(self.min_count, int) or self.min_count < 1):
            raise ConfigError(f"{where}: min_count must be a whole number >= 1")
        if self.kind == "multi" and not self.separator:
            raise ConfigError(f"{where}: a multi-valued column needs a separator")
        if self.list_column and self.kind not in ("multi", "drop"):
            raise ConfigError(f"{where}: list_column: true (a list per cell) is a bag of values: its kind must be "
                              f"multi (or drop)")
        if self.sequence_of and self.kind not in ("multi", "drop"):
            raise ConfigError(f"{where}: sequence_of: {self.sequence_of!r} (a behaviour sequence) needs kind multi "
                              f"(a bag of values in order), got {self.kind!r}")

    @property
    def needs_stats(self) -> bool:
        """Whether encoding this column needs `schema fit` statistics."""
        if self.kind == "numeric":
            return "standardize" in self.transforms or self.bucketize > 0
        return self.kind in ("categorical", "multi") and self.min_count > 1


@dataclass
class Label:
    column: str
    # Values that mean 1 and 0. Both empty: the label is a number, 0/1 or -1/+1. Otherwise any other value is a bad line, so a typo or a
    # "<=50K." spelling in a test file is caught instead of read as negative.
    positive: list = field(default_factory=list)
    negative: list = field(default_factory=list)
    # regression only: {"mean", "std", "count"} of the label over the training data (`schema fit`)
    stats: dict | None = None


@dataclass
class Format:
    type: str = "csv"
    delimiter: str = ","
    header: bool = True
    names: list = field(default_factory=list)     # the file's columns in order, when it has no header
    missing: list = field(default_factory=lambda: list(DEFAULT_MISSING))
    # True (schemas written before `schema infer` recorded the delimiter it chose, hand-written ones):
    # a file named .csv is read with ',' and .tsv with a tab whatever `delimiter` says (a ';' or
    # '|' delimiter always wins). False (what infer and --delimiter write): `delimiter` is used for
    # every text file, so later commands read the files as infer did.
    by_suffix: bool = True


@dataclass
class Schema:
    label: Label
    columns: list
    format: Format = field(default_factory=Format)
    rows_fitted: int = 0
    version: int = VERSION
    label_kind: str = "binary"       # absent from older files: binary
    labels: list = field(default_factory=list)     # multitask only: every label, the first is ``label``

    def __post_init__(self):
        if self.label_kind not in LABEL_KINDS:
            raise ConfigError(f"schema label_kind {self.label_kind!r}: this version supports "
                              f"{', '.join(map(repr, LABEL_KINDS))} labels (binary: 0/1 or -1/+1 numbers, or two "
                              f"values named in label.positive / label.negative; regression: a real number; "
                              f"multitask: several binary labels listed in 'labels')")
        self._check_labels()
        names = [c.name for c in self.columns]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ConfigError(f"schema: column {sorted(dup)[0]!r} is listed twice")
        for label in self.label_names:
            if label in names:
                raise ConfigError(f"schema: the label column {label!r} is also listed as a feature")
        for c in self.columns:
            c.validate()
        self._check_sequences()
        if self.format.type not in FORMATS:
            raise ConfigError(f"schema format.type must be one of {', '.join(FORMATS)}, got {self.format.type!r}")
        if not self.fields and not self.dense_names:
            raise ConfigError("schema: no feature columns (every column is dropped)")

    def _check_sequences(self) -> None:
        by_name = {c.name: c for c in self.columns}
        for c in self.columns:
            if not c.sequence_of or c.kind == "drop":
                continue
            target = by_name.get(c.sequence_of)
            if target is None or target.kind != "categorical":
                got = "no such column" if target is None else f"its kind is {target.kind!r}"
                raise ConfigError(f"schema column {c.name!r}: sequence_of {c.sequence_of!r} must name a categorical "
                                  f"column (the candidate its values are compared with), but {got}")

    def _check_labels(self) -> None:
        if self.label_kind == "multitask":
            if len(self.labels) < 2:
                raise ConfigError("schema label_kind 'multitask' needs two or more binary labels in 'labels' "
                                  "(one label: label_kind 'binary')")
            if self.labels[0].column != self.label.column:
                raise ConfigError(f"schema: 'label' ({self.label.column!r}) must be the first of 'labels' "
                                  f"({self.labels[0].column!r})")
            names = self.label_names
            if len(set(names)) != len(names):
                raise ConfigError(f"schema 'labels': a column is listed twice ({', '.join(names)})")
        elif self.labels:
            raise ConfigError(f"schema 'labels' lists several labels but label_kind is {self.label_kind!r}: set "
                              f"label_kind: multitask (or keep one label in 'label')")
        if self.label_kind == "regression" and (self.label.positive or self.label.negative):
            raise ConfigError(f"schema label {self.label.column!r}: a regression label is a number; "
                              f"label.positive / label.negative are for binary labels")

    # -- the labels --------------------------------------------------------------
    @property
    def tasks(self) -> list[Label]:
        """Every label the model predicts, in output order: ``labels`` (multitask), else ``label``."""
        return list(self.labels) if self.label_kind == "multitask" else [self.label]

    @property
    def label_names(self) -> list[str]:
        return [label.column for label in self.tasks]

    # -- what a batch holds -----------------------------------------------------
    @property
    def dense_names(self) -> list[str]:
        out = []
        for c in self.columns:
            if c.kind == "numeric":
                out += [c.name] if c.dense else []
                out += [f"{c.name}:missing"] if c.missing_indicator else []
        return out

    @property
    def fields(self) -> list[Column]:
        """Columns that give one bag of ids each, in batch order."""
        return [c for c in self.columns if c.kind in ("categorical", "multi") or (c.kind == "numeric" and c.bucketize)]

    @property
    def sequences(self) -> list[tuple[int, int]]:
        """(field index of a behaviour sequence, field index of its candidate), per sequence
        column (``sequence_of``), in schema order: what DIN attends over."""
        index = {c.name: i for i, c in enumerate(self.fields)}
        return [(index[c.name], index[c.sequence_of]) for c in self.fields if c.sequence_of]

    @property
    def num_dense(self) -> int:
        return len(self.dense_names)

    @property
    def num_fields(self) -> int:
        return len(self.fields)

    @property
    def used_columns(self) -> list[str]:
        return self.label_names + [c.name for c in self.columns if c.kind != "drop"]

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise ConfigError(f"schema has no column {name!r}")

    def unfitted(self) -> list[str]:
        """Columns whose transforms need statistics that are not there yet (a regression label's
        mean and std among them: the models train on the standardised label)."""
        label = [self.label.column] if self.label_kind == "regression" and not self.label.stats else []
        return label + [c.name for c in self.columns if c.needs_stats and not c.stats]

    # -- files --------------------------------------------------------------------
    def to_dict(self) -> dict:
        """The file's mapping; a single-label schema without ``labels`` and label ``stats``, as
        before multi-task and regression labels existed."""
        data = asdict(self)
        if not data["labels"]:
            del data["labels"]
        for label in [data["label"]] + data.get("labels", []):
            if label["stats"] is None:
                del label["stats"]
        return data

    @classmethod
    def from_dict(cls, data: dict, where: str = "schema") -> "Schema":
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected a mapping at the top, got {type(data).__name__}")
        try:
            return cls(label=_make(Label, data["label"], f"{where}: label"),
                       columns=[_make(Column, c, f"{where}: column") for c in data["columns"]],
                       format=_make(Format, data.get("format", {}), f"{where}: format"),
                       rows_fitted=int(data.get("rows_fitted", 0)), version=int(data.get("version", VERSION)),
                       label_kind=data.get("label_kind", "binary"),
                       labels=[_make(Label, x, f"{where}: labels") for x in data.get("labels") or []])
        except KeyError as exc:
            raise ConfigError(f"{where}: missing {exc.args[0]!r} (a schema needs 'label' and 'columns'; "
                              f"`paramshard schema infer FILE --label COL` writes one)") from None

    def save(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = self.to_dict()
        if path.suffix in (".yaml", ".yml"):
            import yaml
            text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
        else:
            text = json.dumps(data, indent=1, ensure_ascii=False) + "\n"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.replace(path)           # a reader never sees half a schema
        return path

    @classmethod
    def load(cls, path) -> "Schema":
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read the schema ({exc.strerror})") from None
        try:
            if path.suffix in (".yaml", ".yml"):
                import yaml
                data = yaml.safe_load(text)
            else:
                data = json.loads(text)
        except ValueError as exc:     # json.JSONDecodeError and yaml.YAMLError's parser errors
            raise ConfigError(f"{path}: not valid {'YAML' if path.suffix in ('.yaml', '.yml') else 'JSON'}: "
                              f"{exc}") from None
        return cls.from_dict(data, where=str(path))


def _make(kind, data, where: str):
    if isinstance(data, str) and kind is Label:
        data = {"column": data}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {data!r}")
    known = {f.name for f in fields(kind)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{where} {data.get('name', '')!r}: unknown key {unknown[0]!r} "
                          f"(known: {', '.join(sorted(known))})")
    try:
        return kind(**data)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None
