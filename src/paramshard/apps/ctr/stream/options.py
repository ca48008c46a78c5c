"""The CTR app's --stream options, and what does not combine with them, refused with the reason
(by options.resolve, so `paramshard launch` refuses them before any process starts: arguments.py).

A stream run has no files, no epochs and no hold-out: it trains on events as they arrive until
stopped, scoring each batch before training on it (progressive validation, progressive.py).

The schema must be fitted beforehand (`paramshard schema fit SCHEMA SAMPLE -o FITTED` on a sample
of the events): fitting on the stream's first N events instead would give each trainer its own
statistics (each reads its own share of the stream), make a resumed job's encoding depend on
which events came first, and leave the ids of a served model undefined until the sample is in;
a fitted file is one encoding for every trainer, every restart and the serving side."""
from __future__ import annotations

from paramshard.errors import ConfigError
from paramshard.apps.ctr.stream.progressive import DEFAULT_WINDOW

DEFAULT_REPORT_SECONDS = 10.0

# (attribute, flag, why it does not combine with --stream); every attribute's default is None (or
# the value in REFUSED_VALUES), so given means refused.
REFUSED = (
    ("train", "--train", "the stream's events are the training data"),
    ("test", "--test", "there is no test pass: the progressive figures over the window are the run's"),
    ("valid", "--valid", "there is no validation pass: every event is scored before it trains (progressive "
                         "validation)"),
    ("valid_fraction", "--valid-fraction", "nothing is held out: every event is scored before it trains"),
    ("epochs", "--epochs", "a stream has no epochs: it trains until stopped (SIGTERM or Ctrl-C, --max-events, "
                           "--max-seconds)"),
    ("patience", "--patience", "no epochs to stop early after"),
    ("monitor", "--monitor", "no epochs to pick: the run's model is the last one"),
    ("lr_decay_after", "--lr-decay-after", "no epochs to decay the learning rates after"),
    ("lr_decay_at", "--lr-decay-at", "no epochs to decay the learning rates after"),
    ("weight", "--weight", "the progressive figures are unweighted"),
    ("group_by", "--group-by", "the progressive figures have no GAUC"),
    ("trained_log", "--trained-log", "its audit is per epoch (a stream's audit is its positions, saved with "
                                     "the checkpoints)"),
)
REFUSED_VALUES = (("refit", "always", "--refit always", "there is no selection to refit after"),)
# (attribute, flag): only with --stream.
STREAM_ONLY = (("max_events", "--max-events"), ("max_seconds", "--max-seconds"), ("window", "--window"),
               ("report_every", "--report-every"))


def add_arguments(p) -> None:
    p.add_argument("--stream", metavar="SOURCE",
                   help="train from a live stream instead of files, until stopped: a directory of append-only "
                        "files (CSV/TSV/Parquet/JSON lines, the schema's columns) or kafka://BROKER/TOPIC?group=G; "
                        "each batch is scored before it trains (progressive validation over --window events); "
                        "needs a fitted --schema (docs/training.md \"Training from a stream\")")
    p.add_argument("--max-events", type=int, metavar="N",
                   help="--stream: stop after this many events (the job's, over every trainer)")
    p.add_argument("--max-seconds", type=float, metavar="S", help="--stream: stop after this many seconds")
    p.add_argument("--window", type=int, metavar="W",
                   help=f"--stream: the progressive AUC and log loss are over the last W events "
                        f"(default {DEFAULT_WINDOW:,})")
    p.add_argument("--report-every", type=float, metavar="S",
                   help=f"--stream: log the progressive figures every S seconds (default {DEFAULT_REPORT_SECONDS:g})")


def check(args) -> None:
    """ConfigError naming the first flag that does not combine, and why; fills the stream's defaults."""
    if not getattr(args, "stream", None):
        for name, flag in STREAM_ONLY:
            if getattr(args, name, None) is not None:
                raise ConfigError(f"{flag} goes with --stream only (a run over files stops after its epochs)")
        missing = [flag for name, flag in (("train", "--train"), ("test", "--test")) if not getattr(args, name)]
        if missing:
            raise ConfigError(f"the following arguments are required: {', '.join(missing)} (or --stream SOURCE)")
        return
    for name, flag, why in REFUSED:
        if getattr(args, name, None) is not None:
            raise ConfigError(f"{flag} does not combine with --stream: {why}")
    for name, value, flag, why in REFUSED_VALUES:
        if getattr(args, name, None) == value:
            raise ConfigError(f"{flag} does not combine with --stream: {why}")
    args.refit = "never"
    if args.max_events is not None and args.max_events < 1:
        raise ConfigError(f"--max-events must be >= 1, got {args.max_events}")
    if args.max_seconds is not None and not args.max_seconds > 0:
        raise ConfigError(f"--max-seconds must be > 0, got {args.max_seconds}")
    args.window = DEFAULT_WINDOW if args.window is None else args.window
    if args.window < 1:
        raise ConfigError(f"--window must be >= 1, got {args.window}")
    args.report_every = DEFAULT_REPORT_SECONDS if args.report_every is None else args.report_every
    if not args.report_every > 0:
        raise ConfigError(f"--report-every must be > 0, got {args.report_every}")


def checked_schema(args):
    """The schema a stream run encodes with: fitted, with a binary label (what the progressive AUC
    scores). Every trainer checks it at its start, and `paramshard launch` before it starts any."""
    from paramshard.data.readers.frames import with_delimiter
    from paramshard.specs.schema import Schema
    schema = Schema.load(args.schema)
    schema.format = with_delimiter(schema.format, getattr(args, "delimiter", None))
    unfitted = [n for n in schema.unfitted() if n not in schema.label_names]
    if unfitted:
        raise ConfigError(f"--schema {args.schema}: columns {', '.join(unfitted)} have no statistics, and a stream "
                          f"run does not fit them (every trainer sees other events first): run `paramshard schema "
                          f"fit {args.schema} SAMPLE -o FITTED` on a sample of the events and give --schema FITTED")
    if schema.label_kind != "binary":
        raise ConfigError(f"--schema {args.schema}: a {schema.label_kind} label; --stream's progressive validation "
                          f"scores a binary label (AUC, log loss)")
    return schema
