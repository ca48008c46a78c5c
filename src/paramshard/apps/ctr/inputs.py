"""The CTR app's schema and input files, checked before anything is trained: by every
trainer at its start (training.load_schema) and by `paramshard launch` before it starts
any process (arguments.py). One function, so the two never disagree on what runs."""
from __future__ import annotations

from paramshard.data.features.input_check import check_inputs
from paramshard.data.readers.frames import with_delimiter
from paramshard.specs.schema import Schema
from paramshard.apps.ctr import side as side_columns


def checked_schema(args, trainers: int = 1) -> Schema:
    """The schema, every input file checked against it first (a second, not an epoch, to find an
    empty --test or a misspelt column); not fitted here. With --weight / --group-by (side.py):
    their columns checked in the schema and in every file, and the weight column dropped from
    the schema returned (it weights the loss, it is no feature)."""
    schema = Schema.load(args.schema)
    schema.format = with_delimiter(schema.format, getattr(args, "delimiter", None))     # --delimiter wins
    side = getattr(args, "side", None)
    checked = schema
    if side:
        side_columns.check(schema, side)
        checked = side_columns.for_checking_inputs(schema, side)
    check_inputs(args.train, checked, "train", min_rows=trainers * args.batch_size)
    if args.valid:
        check_inputs(args.valid, checked, "valid")
    check_inputs(args.test, checked, "test")
    return side_columns.for_the_model(schema, side) if side else schema
