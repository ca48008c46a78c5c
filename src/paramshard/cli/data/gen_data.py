"""`paramshard gen-data`: write synthetic CTR data with a known best-possible AUC."""
from __future__ import annotations

from pathlib import Path

from paramshard.data.synthetic import generate_criteo
from paramshard.errors import ConfigError
from paramshard.export import replaced_into_place

HELP = "write synthetic Criteo-format data drawn from a hidden logistic model"
EXAMPLE = "paramshard gen-data data/train.tsv --rows 100000 --seed 1"


def add_arguments(p):
    p.add_argument("out", metavar="OUT", help="file to write (missing directories are created)")
    p.add_argument("--rows", type=int, required=True, metavar="N", help="number of rows")
    p.add_argument("--seed", type=int, default=0, help="same seed, same data and hidden model (default 0)")
    p.add_argument("--format", choices=["criteo"], default="criteo",
                   help="criteo: label, 13 integer and 26 hex categorical columns, tab-separated")
    p.add_argument("--zipf-a", type=float, default=1.2, metavar="A",
                   help="skew of the categorical values (default 1.2; larger = fewer common values)")


def run(args) -> int:
    if args.rows < 0:
        raise ConfigError(f"--rows must be >= 0, got {args.rows}")
    out = Path(args.out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        # a temporary name, then one rename: a reader never sees half a file
        with replaced_into_place(out) as tmp:
            report = generate_criteo(tmp, args.rows, seed=args.seed, zipf_a=args.zipf_a)
    except OSError as exc:  # unwritable directory, a file where a directory should be: a user error
        if isinstance(exc, (FileExistsError, NotADirectoryError)):
            raise ConfigError(f"{args.out}: cannot create directory {out.parent}: a file is in the way") from exc
        name = exc.filename if exc.filename and ".tmp" not in str(exc.filename) else args.out
        raise ConfigError(f"{name}: {exc.strerror}") from exc
    print(f"wrote {report.rows} rows to {out} (seed {args.seed})")
    print(f"click rate {report.click_rate:.4f}")
    print(f"hidden-model AUC {report.hidden_auc:.4f}, log loss {report.hidden_logloss:.4f} "
          "(the best any model can reach on this data)")
    return 0
