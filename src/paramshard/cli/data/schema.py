"""`paramshard schema`: write a schema from a look at a file, fit its statistics, show one."""
from __future__ import annotations

import sys
from pathlib import Path

from paramshard.data.features.fit import fit_schema
from paramshard.data.features.id_columns import ambiguity, without_doubt
from paramshard.data.features.infer import SAMPLE_ROWS, infer
from paramshard.data.readers.frames import with_delimiter
from paramshard.specs.schema import Schema

HELP = "describe a CSV/TSV/Parquet file's columns for the readers and models (infer, fit, show)"
EXAMPLE = ("paramshard schema infer data/adult/train.csv --label income -o adult.schema.json",
           "paramshard schema fit adult.schema.json data/adult/train.csv -o adult.fitted.json",
           "paramshard schema show adult.fitted.json")


def add_arguments(p):
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    infer = sub.add_parser("infer", help="write a first schema by looking at the first rows of FILE")
    infer.add_argument("file", metavar="FILE")
    infer.add_argument("--label", metavar="COL", help="the label column (default: one named like a label); several "
                                                   "binary labels, comma-separated (click,buy), train one head each "
                                                   "(multi-task)")
    infer.add_argument("--label-kind", choices=("binary", "regression"),
                       help="the label's kind when the guess is wrong (default: binary for two values, regression "
                            "for real numbers; a 0..5 rating needs --label-kind regression)")
    infer.add_argument("--sample-rows", type=int, default=SAMPLE_ROWS, metavar="N",
                       help=f"rows to look at (default {SAMPLE_ROWS})")
    infer.add_argument("--categorical", action="append", default=[], metavar="COLS",
                       help="these columns (comma-separated) are categories whatever they look like, e.g. "
                            "integer ids the guess took for numbers")
    infer.add_argument("--numeric", action="append", default=[], metavar="COLS",
                       help="these columns (comma-separated) are numbers whatever they look like")
    infer.add_argument("--drop", action="append", default=[], metavar="COLS",
                       help="drop these columns (comma-separated), e.g. a key that names rows")
    infer.add_argument("--multi", action="append", default=[], metavar="COL:SEP",
                       help="this text column holds several values split by SEP (a bag), e.g. genres:/")
    infer.add_argument("--sequence", action="append", default=[], metavar="SEQ:CAND",
                       help="SEQ (a bag column, oldest first) is a behaviour sequence of the category CAND, "
                            "in CAND's id space (the --model din input), e.g. hist_item_ids:item_id")
    infer.add_argument("--delimiter", metavar="D", help="the file's delimiter (',' ';' '|' 'tab'; default: the "
                                                       "one its header is split by); recorded in the schema")
    infer.add_argument("-o", "--out", metavar="SCHEMA", help="write here (.json or .yaml); default: print it")
    fit = sub.add_parser("fit", help="compute the statistics the transforms need, in one pass over the data")
    fit.add_argument("schema", metavar="SCHEMA")
    fit.add_argument("files", metavar="FILE", nargs="+", help="the training data (not the test data)")
    fit.add_argument("-o", "--out", metavar="FITTED", required=True, help="the fitted schema to write")
    fit.add_argument("--skip-bad-lines", action="store_true", help="ignore malformed lines instead of failing")
    fit.add_argument("--delimiter", metavar="D", help="the files' delimiter (default: the one the schema records); "
                                                     "recorded in the fitted schema")
    show = sub.add_parser("show", help="one line per column: kind, transforms, statistics; '?' marks a "
                                       "doubtful guess, with the reason")
    show.add_argument("schema", metavar="SCHEMA")


def run(args) -> int:
    if args.action == "infer":
        inferred = infer(args.file, label=args.label, sample_rows=args.sample_rows, categorical=args.categorical,
                         numeric=args.numeric, drop=args.drop, multi=args.multi, delimiter=args.delimiter,
                         sequence=args.sequence, label_kind=args.label_kind)
        schema = inferred.schema
        # With the schema on stdout, what is said about it goes to stderr.
        say = sys.stdout if args.out else sys.stderr
        for name, note in inferred.dropped:
            if note.startswith("dropped: "):
                print(f"dropped {name}: {note.removeprefix('dropped: ')}", file=say)
        for warning in inferred.warnings:
            print(f"warning: {warning}", file=say)
        if args.out:
            schema.save(args.out)
            print(f"wrote {args.out}: {describe(schema)}")
            doubtful = [c.name for c in schema.columns if ambiguity(c)]
            if doubtful:
                print(f"check {', '.join(doubtful)}: the guess is doubtful (`paramshard schema show "
                      f"{args.out}` says why); settle with --categorical / --numeric")
            print(f"edit it if a guess is wrong, then: paramshard schema fit {args.out} TRAIN_FILES -o FITTED")
        else:
            import json
            json.dump(schema.to_dict(), sys.stdout, indent=1)
            print()
    elif args.action == "fit":
        schema = Schema.load(args.schema)
        schema.format = with_delimiter(schema.format, args.delimiter)
        fitted = fit_schema(schema, args.files, skip_bad_lines=args.skip_bad_lines)
        fitted.save(args.out)
        print(f"wrote {args.out}: statistics of {fitted.rows_fitted:,} rows; {describe(fitted)}")
    else:
        schema = Schema.load(args.schema)
        print(describe(schema))
        for line in column_lines(schema):
            print(line)
        doubtful_count = sum(bool(ambiguity(c)) for c in schema.columns)
        if doubtful_count:
            print(f"{doubtful_count} column(s) marked '?': the kind may be wrong (reason after 'ambiguous:'); "
                  f"`schema infer --categorical COLS --numeric COLS` or edit their kind")
    return 0


def describe(schema: Schema) -> str:
    targets = [f"{label.column} ({'/'.join(label.positive)} = 1)" if label.positive else label.column
               for label in schema.tasks]
    stats = schema.label.stats
    target = (f"labels {', '.join(targets)} (multi-task: one binary head each)" if schema.label_kind == "multitask"
              else f"label {targets[0]}" + (" (regression" + (f": mean {stats['mean']:.4g} std {stats['std']:.4g}"
                                                              if stats else "") + ")"
                                            if schema.label_kind == "regression" else ""))
    dropped = [c.name for c in schema.columns if c.kind == "drop"]
    return (f"{target}, {schema.num_dense} dense features, {schema.num_fields} id fields"
            + (f", dropped {', '.join(dropped)}" if dropped else ""))


def column_lines(schema: Schema) -> list[str]:
    out = []
    for c in schema.columns:
        what = c.kind
        if c.kind == "numeric":
            what += f" {'+'.join(c.transforms) or 'raw'}" + (f", {c.bucketize} buckets" if c.bucketize else "")
            what += ", missing indicator" if c.missing_indicator else ""
        elif c.kind == "multi":
            what += " list per cell (order kept)" if c.list_column else f" split on {c.separator!r}"
            what += f", sequence of {c.sequence_of}" if c.sequence_of else ""
        if c.stats:
            s = c.stats
            what += (f"  mean {s['mean']:.4g} std {s['std']:.4g}" if "mean" in s
                     else f"  {s['distinct']:,} distinct") + f", {s['missing']:,} missing"
        doubt = ambiguity(c)
        note = without_doubt(c.note)
        out.append(f"{'?' if doubt else ' '} {c.name:24s} {what}" + (f"   ({note})" if note else "")
                   + (f"   ambiguous: {doubt}" if doubt else ""))
    return out
