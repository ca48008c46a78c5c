"""A job's input files checked before anything is trained, so a wrong or empty
file fails in a second with the real problem named, not after an epoch (an
empty --test) or with unrelated advice ("use a smaller --batch-size" for an
empty --train).

    rows = check_inputs(args.train, schema, "train", min_rows=trainers * batch_size)
    check_inputs(args.test, schema, "test")

Cheap whatever the file's size: a text file is read up to its header and
the first rows (until ``min_rows`` are seen), a Parquet file only for its
metadata (names, row count). Every failure is a ConfigError naming the flag
(``--train``), the file and what to do: a path that is not there (with the
nearest file names beside it), an empty file, a header with no rows, the
label or feature columns the schema needs and the file lacks (each with a
"did you mean" when a name is near, and a word on the delimiter when the
whole header reads as one column).
"""
from __future__ import annotations

from pathlib import Path

from paramshard.errors import ConfigError
from paramshard.data.readers._reader import iter_chunks
from paramshard.data.readers.frames import delimiter_hint, file_format, header_names, open_parquet
from paramshard.data.features.names import did_you_mean
from paramshard.specs.schema import Schema

# Roles whose files must hold the label: training and every kind of evaluation. Others
# (e.g. "predict") are read for their features only.
LABELLED_ROLES = ("train", "test", "valid", "eval")
HEAD_BYTES = 1 << 16          # read at a time while looking for the header and the first rows
SHOWN_NAMES = 12              # columns listed in a message, so a 1000-column header stays readable


def check_inputs(paths, schema: Schema, role: str = "train", min_rows: int = 1) -> int:
    """Raise ConfigError if the files cannot feed ``schema``; else the rows seen: exact for
    Parquet, and for text at least min(min_rows, the rows there are) (the rest is not read).

    Each file must exist and hold at least one data row with every column the schema uses
    (the label too for a labelled ``role``); all together must hold ``min_rows`` rows."""
    flag = f"--{role}"
    paths = _existing(paths, flag)
    total = 0
    for path in paths:
        total += _check_file(path, schema, flag, role in LABELLED_ROLES, want=max(min_rows - total, 1))
    if total < min_rows:
        where = str(paths[0]) if len(paths) == 1 else f"{len(paths)} files"
        advice = ("every trainer needs one full batch: pass more data, or use fewer trainers or a smaller "
                  "--batch-size" if role == "train" else "pass more data")
        raise ConfigError(f"{flag}: {total} data rows in {where}, fewer than the {min_rows} needed ({advice})")
    return total


def _existing(paths, flag: str) -> list[Path]:
    items = [paths] if isinstance(paths, (str, Path)) else list(paths or ())
    if not items:
        raise ConfigError(f"{flag}: no input files given")
    out = []
    for p in map(Path, items):
        if p.is_dir():
            raise ConfigError(f"{flag} {p}: is a directory; pass its files (e.g. {p}/*.csv)")
        if not p.is_file():
            near = did_you_mean(p.name, _siblings(p))
            raise ConfigError(f"{flag} {p}: no such file{near}")
        out.append(p)
    return out


def _siblings(p: Path) -> list[str]:
    try:
        return [q.name for q in p.parent.iterdir() if q.is_file()] if p.parent.is_dir() else []
    except OSError:
        return []


def _check_file(path: Path, schema: Schema, flag: str, labelled: bool, want: int) -> int:
    if path.stat().st_size == 0:
        raise ConfigError(f"{flag} {path}: empty file (0 bytes): check that it was downloaded or written "
                          f"completely")
    fmt = schema.format
    kind, delimiter = file_format(path, fmt)
    if kind == "parquet":
        meta = open_parquet(path)
        names, rows = list(meta.schema_arrow.names), meta.metadata.num_rows
        if rows == 0:
            raise ConfigError(f"{flag} {path}: a Parquet file with columns ({_shown(names)}) but no rows")
    else:
        names, rows = _text_head(path, fmt, delimiter, want, flag)
    if fmt.type != "libsvm":
        _check_columns(path, schema, flag, labelled, names, delimiter)
    return rows


def _text_head(path: Path, fmt, delimiter: str, want: int, flag: str) -> tuple[list[str], int]:
    """(column names, non-blank data lines) of the file's first chunks, read until ``want`` rows."""
    header = fmt.header and fmt.type != "libsvm"
    names, rows, seen_bytes = (None if header else list(fmt.names)), 0, False
    for _, chunk in iter_chunks(path, HEAD_BYTES):
        seen_bytes = True
        lines = chunk.split(b"\n")[:-1]
        if names is None:
            if not lines[0].strip():
                raise ConfigError(f"{flag} {path}: the first line, which the schema says is the header, is "
                                  f"blank; remove the blank line(s) at the top")
            names, lines = header_names(lines[0], delimiter), lines[1:]
        rows += sum(1 for line in lines if line.strip())
        if rows >= want:
            break
    if not seen_bytes:
        raise ConfigError(f"{flag} {path}: empty file (no lines after decompression): check that it was "
                          f"written completely")
    assert names is not None            # the header, read from the first chunk
    if rows == 0:
        if header:
            raise ConfigError(f"{flag} {path} has a header ({_shown(names)}) but no data rows: pass a file "
                              f"with data")
        raise ConfigError(f"{flag} {path}: no data rows (only blank lines)")
    if not header and not names and fmt.type != "libsvm":
        raise ConfigError(f"{flag} {path}: the schema says the file has no header but lists no column "
                          f"names (format.names); add them, or set format.header: true")
    return names, rows


def _check_columns(path: Path, schema: Schema, flag: str, labelled: bool, names: list[str],
                   delimiter: str) -> None:
    absent = [label for label in schema.label_names if label not in names] if labelled else []
    if absent:
        label = absent[0]
        raise ConfigError(f"{flag} {path}: no label column {label!r}{did_you_mean(label, names)}; the file "
                          f"has {_shown(names)}{delimiter_hint(names, delimiter)}")
    missing = [c.name for c in schema.columns if c.kind != "drop" and c.name not in names]
    if missing:
        listed = ", ".join(f"{m!r}{did_you_mean(m, names)}" for m in missing[:SHOWN_NAMES])
        more = f" and {len(missing) - SHOWN_NAMES} more" if len(missing) > SHOWN_NAMES else ""
        raise ConfigError(f"{flag} {path}: lacks the schema's column(s) {listed}{more}; the file has "
                          f"{_shown(names)}{delimiter_hint(names, delimiter)}. Fix the file's header, or the "
                          f"schema's names (or kind: drop for a column the file does not have)")


def _shown(names: list[str]) -> str:
    shown = ", ".join(names[:SHOWN_NAMES])
    return shown + (f", ... ({len(names)} columns)" if len(names) > SHOWN_NAMES else "")
