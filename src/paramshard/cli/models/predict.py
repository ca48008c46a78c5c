"""`paramshard predict`: a model file scores data files, with no code (paramshard/inference/scoring.py)."""
from __future__ import annotations

import sys

HELP = ("score the rows of CSV/TSV/Parquet files with a model file (its recorded model and fitted schema): "
        "one probability per row, in order")
EXAMPLE = ("paramshard predict model.pt test.csv --out scores.csv",
           "paramshard predict model.pt new.csv --keep id --out scores.csv",
           "paramshard predict model.pt new-*.parquet --out scores.parquet")


def add_arguments(p) -> None:
    p.add_argument("model", metavar="MODEL", help="a model file (`paramshard export` or export-model)")
    p.add_argument("data", nargs="+", metavar="DATA", help="CSV, TSV or Parquet files; the label column may be absent")
    p.add_argument("--out", metavar="FILE", help="where the scores go: .csv, .tsv, .parquet or .pq "
                                                  "(default: CSV on stdout)")
    p.add_argument("--keep", nargs="+", default=[], metavar="COL",
                   help="copy these input columns (an id, a key to join on) into the scores file, before the "
                        "score, row for row")
    p.add_argument("--batch-size", type=int, default=8192, metavar="N", help="rows per forward")
    p.add_argument("--delimiter", metavar="D",
                   help="text files' delimiter (',' ';' '|' 'tab'; default: the one the model's schema records)")


def run(args) -> int:
    from paramshard.inference.scoring import predict_files       # torch and pandas: imported only when this command runs

    result = predict_files(args.model, args.data, args.out, args.batch_size, keep=args.keep,
                           delimiter=getattr(args, "delimiter", None))
    # With the scores on stdout, what is said about them goes to stderr.
    say = sys.stderr if args.out is None else sys.stdout
    where = f" to {args.out}" if args.out else ""
    line = f"scored {result['rows']:,} rows{where}"
    if result["labels"] and "rmse" in result:          # a regression model
        line += f": RMSE {result['rmse']:.4f}, MSE {result['mse']:.4f}, MAE {result['mae']:.4f}"
    elif result["labels"]:
        line += (f": {'mean ' if 'tasks' in result else ''}AUC {result['auc']:.4f}, logloss {result['logloss']:.4f}, "
                 f"accuracy {result['accuracy']:.4f}")
        if "tasks" in result:
            line += " (" + ", ".join(f"{name} AUC {t['auc']:.4f}" for name, t in result["tasks"].items()) + ")"
    print(line, file=say)
    return 0
