"""The CTR app's command line, and its defaults per model (models/defaults.py).

A flag left out takes the chosen model's default, printed at the start, so a
run says what it trained with; an explicit flag always wins. --valid-fraction,
--patience and --lr-decay-after left out scale with --train's rows instead
(table_size.py: a minimum of validation rows, gentler selection on a small table)."""
from __future__ import annotations

import argparse

from paramshard.errors import ConfigError
from paramshard.data.shards.tasks import DEFAULT_TASK_BYTES
from paramshard.models import MODELS
from paramshard.models.defaults import architecture_defaults, training_defaults
from paramshard.data.features.side_columns import SideColumns
from paramshard.apps.ctr import refit, table_size
from paramshard.apps.ctr.stream import options as stream_options
from paramshard.apps.ctr.selection import MONITORS, Selection


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m paramshard.apps.ctr", description=description,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--train", nargs="+", metavar="PATH", help="training files (CSV, TSV, Parquet; required without --stream)")
    p.add_argument("--test", nargs="+", metavar="PATH", help="test files, same columns (required without --stream)")
    p.add_argument("--schema", required=True, metavar="FILE", help="from `paramshard schema infer` (and fit)")
    p.add_argument("--delimiter", metavar="D",
                   help="text files' delimiter (',' ';' '|' 'tab'; default: the one the schema records)")
    p.add_argument("--model", choices=sorted(MODELS), default="deepfm")
    p.add_argument("--valid", nargs="+", metavar="PATH",
                   help="validation files, same columns: pick the best epoch on them (default: hold out "
                        "--valid-fraction of --train)")
    p.add_argument("--valid-fraction", type=float, metavar="F",
                   help="without --valid: this part of --train's rows (chosen by a seeded hash of the row "
                        "number; in an elastic job, of the row's fields) is held out for validation, never trained on; 0: no validation, keep the last epoch "
                        "(default: 0.1, or 1,000 rows on a small table, at most 0.25: apps/ctr/table_size.py)")
    p.add_argument("--epochs", type=int,
                   help="at most this many epochs (early stopping may end sooner; default: 10, or on a table of "
                        "fewer than 100,000 rows enough for 200 batches of --batch-size, at most 100: "
                        "apps/ctr/table_size.py)")
    p.add_argument("--patience", type=int,
                   help="stop after this many epochs in a row without a better validation score (0: never early; "
                        "default: 2, or 4 on a table of fewer than 100,000 rows)")
    p.add_argument("--monitor", choices=sorted(MONITORS),
                   help="the validation metric that picks the best epoch (default: auc; rmse for a regression "
                        "label; a multi-task run's auc and logloss are the means over its labels)")
    p.add_argument("--lr-decay", type=float, default=0.1, metavar="F",
                   help="multiply every learning rate by F after --lr-decay-after epochs without improvement (1: never)")
    # -- issue 32: the decays' pace, sample weights, GAUC ---------------------------------------------
    p.add_argument("--lr-decay-after", type=int, metavar="N",
                   help="decay the learning rates after every N epochs in a row without improvement (default: "
                        "half of --patience, at least 1)")
    p.add_argument("--lr-decay-at", metavar="E1,E2",
                   help="a fixed schedule instead of decays on a plateau: multiply every learning rate by "
                        "--lr-decay after each of these epochs (what a refit repeats: apps/ctr/refit.py)")
    p.add_argument("--refit", choices=refit.MODES, default="auto",
                   help="after selection, train a fresh model on all of --train (the hold-out too) for the best "
                        "epoch count, with the same seed and decays, and make it the run's model (test figures, "
                        "--export); auto: on a table of fewer than 100,000 rows whose hold-out comes from --train, "
                        "in one process (apps/ctr/refit.py)")
    p.add_argument("--weight", metavar="COL",
                   help="a numeric column of the schema whose value weights each row's loss and metrics (weighted "
                        "log loss, AUC, accuracy); not a feature; needed in --valid and --test files too")
    p.add_argument("--group-by", metavar="COL",
                   help="report GAUC beside AUC: the AUC of each value of COL (e.g. user_id), averaged weighted by "
                        "its rows; values whose rows are all one class are skipped (--monitor gauc picks epochs by it)")
    p.add_argument("--embedding-l2", type=float, default=0.0, metavar="L2",
                   help="L2 regularisation of the table rows a step looks up (the tables' weight decay)")
    p.add_argument("--batch-size", type=int, help="rows per step per trainer (default: the model's, 256)")
    p.add_argument("--dim", type=int, help="embedding width (default: the model class's)")
    p.add_argument("--hidden", help="MLP widths, comma-separated (default: the model class's)")
    p.add_argument("--max-len", type=int, help="din only: positions of a behaviour sequence kept, the most recent "
                                               "(default: the model class's, 50)")
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
    stream_options.add_arguments(p)      # issue 33: --stream and what goes with it (stream/options.py)
    return p


def resolve(args) -> argparse.Namespace:
    """Checks every value and fills the model's defaults in; returns args (changed in place)."""
    stream_options.check(args)      # before the epoch defaults below fill in what a stream refuses
    train = training_defaults(args.model)
    arch = architecture_defaults(MODELS[args.model])
    args.defaulted = [name for name in ("lr", "table_lr", "batch_size") if getattr(args, name) is None]
    for name in args.defaulted:
        setattr(args, name, getattr(train, name))
    for name in ("dim", "hidden"):
        if getattr(args, name) is not None and name not in arch:
            raise ConfigError(f"--{name}: the {args.model} model has no {name} (it has no embeddings or MLP)")
    if args.max_len is not None and ("max_len" not in arch or args.max_len < 1):
        raise ConfigError(f"--max-len {args.max_len}: " + ("must be >= 1" if "max_len" in arch else
                                                           f"only DIN has a sequence to cut (not {args.model})"))
    if args.hidden is not None:
        try:
            args.hidden = tuple(int(h) for h in args.hidden.split(",") if h.strip())
        except ValueError:
            raise ConfigError(f"--hidden {args.hidden!r}: expected widths like 128,64") from None
    args.architecture = {name: getattr(args, name) if getattr(args, name, None) is not None else value
                         for name, value in arch.items()}
    # --epochs left out scales with the table too (table_size.settle), from the large table's cap.
    args.epochs_scaled = args.epochs is None
    if args.epochs is None:
        args.epochs = table_size.DEFAULT_EPOCHS
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
    if args.valid is not None and args.valid_fraction not in (None, 0):
        raise ConfigError("give --valid FILES or --valid-fraction F, not both")
    if args.valid is None and args.valid_fraction is not None and not 0 <= args.valid_fraction < 1:
        raise ConfigError(f"--valid-fraction {args.valid_fraction}: must be in [0, 1)")
    # Left out, these take the large-table defaults here and scale with --train's rows once they
    # are counted (table_size.settle, at the run's start).
    args.scaled = [name for name in ("valid_fraction", "patience", "lr_decay_after") if getattr(args, name) is None]
    if args.epochs_scaled:
        args.scaled.append("epochs")
    if args.valid_fraction is None:
        args.valid_fraction = table_size.DEFAULT_VALID_FRACTION
    if args.patience is None:
        args.patience = table_size.PATIENCE
    if args.lr_decay_after is None:
        args.lr_decay_after = table_size.decay_after(args.patience)
    # --monitor left out: auc until the schema's label kind is known (selection.settle_monitor: rmse for a regression).
    args.monitor_given, args.monitor = args.monitor is not None, args.monitor or "auc"
    args.selection = Selection(args.monitor, args.patience, args.lr_decay, args.lr_decay_after)
    args.lr_decay_at = refit.decay_epochs(args.lr_decay_at)
    if args.weight is not None and args.weight == args.group_by:
        raise ConfigError(f"--weight and --group-by name the same column {args.weight!r}: a weight is no group key")
    if args.monitor == "gauc" and args.group_by is None:
        raise ConfigError("--monitor gauc needs --group-by COL (the column whose values are the groups, e.g. user_id)")
    args.side = SideColumns(args.weight, args.group_by)
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
