"""The CTR app's command line, and its defaults per model (models/defaults.py).

A flag left out takes the chosen model's default, printed at the start, so a
run says what it trained with; an explicit flag always wins."""
from __future__ import annotations

import argparse

from paramshard.errors import ConfigError
from paramshard.data.shards.tasks import DEFAULT_TASK_BYTES
from paramshard.models import MODELS
from paramshard.models.defaults import architecture_defaults, training_defaults
from paramshard.apps.ctr.selection import MONITORS, Selection

DEFAULT_VALID_FRACTION = 0.1


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m paramshard.apps.ctr", description=description,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--train", nargs="+", required=True, metavar="PATH", help="training files (CSV, TSV, Parquet)")
    p.add_argument("--test", nargs="+", required=True, metavar="PATH", help="test files, same columns")
    p.add_argument("--schema", required=True, metavar="FILE", help="from `paramshard schema infer` (and fit)")
    p.add_argument("--delimiter", metavar="D",
                   help="text files' delimiter (',' ';' '|' 'tab'; default: the one the schema records)")
    p.add_argument("--model", choices=sorted(MODELS), default="deepfm")
    p.add_argument("--valid", nargs="+", metavar="PATH",
                   help="validation files, same columns: pick the best epoch on them (default: hold out "
                        "--valid-fraction of --train)")
    p.add_argument("--valid-fraction", type=float, default=DEFAULT_VALID_FRACTION, metavar="F",
                   help="without --valid: this part of --train's rows (chosen by a seeded hash of the row "
                        "number; in an elastic job, of the row's fields) is held out for validation, never trained on; 0: no validation, keep the last epoch")
    p.add_argument("--epochs", type=int, default=10, help="at most this many epochs (early stopping may end sooner)")
    p.add_argument("--patience", type=int, default=2,
                   help="stop after this many epochs in a row without a better validation score (0: never early)")
    p.add_argument("--monitor", choices=sorted(MONITORS), default="auc", help="the validation metric that picks the best epoch")
    p.add_argument("--lr-decay", type=float, default=0.1, metavar="F",
                   help="multiply every learning rate by F after an epoch without improvement (1: never)")
    p.add_argument("--embedding-l2", type=float, default=0.0, metavar="L2",
                   help="L2 regularisation of the table rows a step looks up (the tables' weight decay)")
    p.add_argument("--batch-size", type=int, help="rows per step per trainer (default: the model's, 256)")
    p.add_argument("--dim", type=int, help="embedding width (default: the model class's)")
    p.add_argument("--hidden", help="MLP widths, comma-separated (default: the model class's)")
    p.add_argument("--lr", type=float, help="Adam learning rate of the dense parameters (default: the model's)")
    p.add_argument("--table-lr", type=float, help="Adagrad learning rate of the table rows (default: the model's)")
    p.add_argument("--buckets", type=int, default=1 << 16,
                   help="collective mode only: rows of each hashed table every trainer holds (a power of two)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-bad-lines", action="store_true", help="count malformed lines instead of failing")
    p.add_argument("--export", metavar="FILE",
                   help="write the best epoch's model here (`paramshard predict FILE DATA` scores new rows)")
    p.add_argument("--json", metavar="OUT", help="write per-epoch and final test metrics here (trainer 0)")
    p.add_argument("--task-bytes", type=int, default=DEFAULT_TASK_BYTES, metavar="B",
                   help="elastic jobs (launch --trainers MIN:MAX): --train is handed out by the shard service in "
                        "tasks of about this many bytes")
    p.add_argument("--trained-log", metavar="DIR",
                   help="every trainer process writes the rows it trained per epoch (and a checksum of their ids) "
                        "to DIR/trained-<slot>-<pid>.jsonl: an audit that each training row is trained once per "
                        "epoch, whoever joined or left")
    return p


def resolve(args) -> argparse.Namespace:
    """Checks every value and fills the model's defaults in; returns args (changed in place)."""
    train = training_defaults(args.model)
    arch = architecture_defaults(MODELS[args.model])
    args.defaulted = [name for name in ("lr", "table_lr", "batch_size") if getattr(args, name) is None]
    for name in args.defaulted:
        setattr(args, name, getattr(train, name))
    for name in ("dim", "hidden"):
        if getattr(args, name) is not None and name not in arch:
            raise ConfigError(f"--{name}: the {args.model} model has no {name} (it has no embeddings or MLP)")
    if args.hidden is not None:
        try:
            args.hidden = tuple(int(h) for h in args.hidden.split(",") if h.strip())
        except ValueError:
            raise ConfigError(f"--hidden {args.hidden!r}: expected widths like 128,64") from None
    args.architecture = {name: getattr(args, name) if getattr(args, name, None) is not None else value
                         for name, value in arch.items()}
    for name in ("epochs", "batch_size", "task_bytes"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.dim is not None and args.dim < 1:
        raise ConfigError(f"--dim must be >= 1, got {args.dim}")
    for name in ("lr", "table_lr"):
        if not getattr(args, name) > 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.embedding_l2 < 0:
        raise ConfigError(f"--embedding-l2 must be >= 0, got {args.embedding_l2}")
    if args.valid is not None and args.valid_fraction not in (0, DEFAULT_VALID_FRACTION):
        raise ConfigError("give --valid FILES or --valid-fraction F, not both")
    if args.valid is None and not 0 <= args.valid_fraction < 1:
        raise ConfigError(f"--valid-fraction {args.valid_fraction}: must be in [0, 1)")
    args.selection = Selection(args.monitor, args.patience, args.lr_decay)
    return args


def describe(args) -> str:
    """What the run trains with, marking the values that are the model's defaults."""
    def mark(name):
        return " (the model's default)" if name in args.defaulted else ""
    arch = ", ".join(f"{k} {v}" for k, v in args.architecture.items())
    return (f"{args.model}{' (' + arch + ')' if arch else ''}: Adam lr {args.lr:g}{mark('lr')} for the dense "
            f"parameters, Adagrad lr {args.table_lr:g}{mark('table_lr')} for the table rows"
            f"{f' (L2 {args.embedding_l2:g})' if args.embedding_l2 else ''}, batch {args.batch_size}"
            f"{mark('batch_size')}")
