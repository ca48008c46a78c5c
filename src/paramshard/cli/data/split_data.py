"""`paramshard split-data`: cut input files into one part per trainer."""
from __future__ import annotations

import sys

from paramshard.data.readers._reader import MAX_LINE_BYTES
from paramshard.data.shards.split import SPLIT_BY, split_lines
from paramshard.errors import ConfigError

HELP = "split input files into DIR/part-00000.. for the trainers (line i goes to part i mod N)"
EXAMPLE = "paramshard split-data data/train.tsv --shards 4 --out data/shards"


def add_arguments(p):
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="text files (plain or .gz), read in order")
    p.add_argument("--shards", type=int, required=True, metavar="N", help="number of parts to write")
    p.add_argument("--out", required=True, metavar="DIR", help="directory for part-NNNNN files")
    p.add_argument("--by", choices=SPLIT_BY, default="lines",
                   help="lines: deal lines round-robin (default); files: whole input j -> part j %% N")
    p.add_argument("--force", action="store_true", help="replace part files already in DIR")
    p.add_argument("--max-line-bytes", type=int, default=MAX_LINE_BYTES, metavar="BYTES",
                   help=f"longest line accepted (default {MAX_LINE_BYTES}); a longer one is an error")


def run(args) -> int:
    try:
        report = split_lines(args.inputs, args.shards, args.out, by=args.by, force=args.force,
                             max_line_bytes=args.max_line_bytes)
    except OSError as exc:  # unreadable input, unwritable DIR: a user error, not a crash
        raise ConfigError(f"{exc.filename or args.out}: {exc.strerror}") from exc
    width = max(len(str(n)) for n in report.lines)
    for path, n in zip(report.parts, report.lines):
        print(f"{path}  {n:>{width}} lines")
    print(f"{sum(report.lines)} lines in {len(report.parts)} parts")
    empty = [p.name for p, n in zip(report.parts, report.lines) if n == 0]
    if empty:
        print(f"warning: {len(empty)} part(s) are empty ({', '.join(empty[:3])}...): "
              "the trainers reading them get no data; use fewer --shards", file=sys.stderr)
    return 0
