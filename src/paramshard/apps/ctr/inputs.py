"""The CTR app's schema and input files, checked before anything is trained: by every
trainer at its start (training.load_schema) and by `paramshard launch` before it starts
any process (arguments.py). One function, so the two never disagree on what runs."""
from __future__ import annotations

from paramshard.data.features.input_check import check_inputs
from paramshard.data.readers.frames import with_delimiter
from paramshard.specs.schema import Schema


def checked_schema(args, trainers: int = 1) -> Schema:
    """The schema, every input file checked against it first (a second, not an epoch, to find an
    empty --test or a misspelt column); not fitted here."""
    schema = Schema.load(args.schema)
    schema.format = with_delimiter(schema.format, getattr(args, "delimiter", None))     # --delimiter wins
    check_inputs(args.train, schema, "train", min_rows=trainers * args.batch_size)
    if args.valid:
        check_inputs(args.valid, schema, "valid")
    check_inputs(args.test, schema, "test")
    return schema
