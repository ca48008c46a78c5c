"""``--weight COL`` and ``--group-by COL`` against the schema (data/features/side_columns.py
carries them through the readers).

- The weight column must be in the schema, numeric (or already ``kind: drop``): it becomes
  ``drop`` in the schema the model is built with, so it is never a feature and `paramshard
  predict` does not need it in new data.
- The group column may be any column of the schema (a feature such as ``user_id`` stays one).
- Both must be in every file the app reads (--train, --valid, --test: validation and test
  metrics are weighted and grouped too), checked with the other columns before anything trains.
"""
from __future__ import annotations

import dataclasses

from paramshard.errors import ConfigError
from paramshard.specs.schema import Schema


def check(schema: Schema, side) -> None:
    names = {c.name: c for c in schema.columns}
    for flag, name in (("--weight", side.weight), ("--group-by", side.group)):
        if name is None:
            continue
        if name in schema.label_names:
            raise ConfigError(f"{flag} {name!r}: that is the label column"
                              + ("" if len(schema.label_names) == 1 else " (one of the multi-task labels)"))
        if name not in names:
            raise ConfigError(f"{flag} {name!r}: the schema has no such column (its columns: "
                              f"{', '.join(names)}); add it to the schema (kind: drop if it is no feature)")
    if side.weight is not None and names[side.weight].kind not in ("numeric", "drop"):
        raise ConfigError(f"--weight {side.weight!r}: a {names[side.weight].kind} column; a weight is a number >= 0 "
                          f"per row (kind: numeric or drop in the schema)")


def for_checking_inputs(schema: Schema, side) -> Schema:
    """The schema with the side columns as used columns, so check_inputs names a file lacking one."""
    wanted = set(side.names)
    return dataclasses.replace(schema, columns=[
        dataclasses.replace(c, kind="categorical") if c.name in wanted and c.kind == "drop" else c
        for c in schema.columns])


def for_the_model(schema: Schema, side) -> Schema:
    """The schema with the weight column dropped: it weights the loss, it is not a feature."""
    if side.weight is None:
        return schema
    return dataclasses.replace(schema, columns=[
        dataclasses.replace(c, kind="drop", note=f"the sample weight (--weight {c.name}), not a feature")
        if c.name == side.weight else c for c in schema.columns])
