"""`paramshard replay`: append a data file's records to a directory as a live stream."""
from __future__ import annotations

import signal
import sys
from pathlib import Path

from paramshard.errors import ConfigError

HELP = ("append a CSV/Parquet file's records to a directory at a rate, as growing files "
        "(a live stream for `--stream DIR`)")
EXAMPLE = "paramshard replay data/train.csv --into events/ --rate 2000"


def add_arguments(p):
    from paramshard.data.stream.replay import FORMATS
    p.add_argument("data", metavar="DATA", help="a .csv (header line) or .parquet file of records")
    p.add_argument("--into", required=True, metavar="DIR", help="directory the events are appended to")
    p.add_argument("--rate", type=float, default=1000.0, metavar="R",
                   help="records per second (0: as fast as possible; default 1000)")
    p.add_argument("--format", choices=FORMATS, default="csv", help="file format written (default csv)")
    p.add_argument("--file-rows", type=int, default=100_000, metavar="N", help="records per file before a new one")
    p.add_argument("--loops", type=int, default=1, metavar="K", help="times over DATA (default 1)")
    p.add_argument("--max-rows", type=int, default=None, metavar="N", help="stop after N records")
    p.add_argument("--log", metavar="FILE", help="append one JSON line per append (first, count, file, at)")


def _read(path: Path):
    import pandas as pd
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    return pd.read_csv(path, sep=None, engine="python")     # the delimiter sniffed: CSV, TSV, ...


def run(args) -> int:
    from paramshard.data.stream.replay import append_log_line, replay
    frame = _read(Path(args.data))
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    log = open(args.log, "a", encoding="utf-8") if args.log else None

    def logged(appended):
        if log is not None:
            log.write(append_log_line(appended) + "\n")
            log.flush()
    try:
        total = replay(frame, args.into, args.rate, args.format, args.file_rows, loops=args.loops,
                       max_rows=args.max_rows, on_append=logged, stop=lambda: bool(stopping))
    except KeyboardInterrupt:
        print("replay: interrupted", file=sys.stderr)
        return 130
    finally:
        if log is not None:
            log.close()
    print(f"replay: {total} records appended to {args.into}")
    return 0
