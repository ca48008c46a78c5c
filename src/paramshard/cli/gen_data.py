"""`paramshard gen-data`: write synthetic CTR data with a known best-possible AUC."""
from __future__ import annotations

from ..data.synthetic import generate_criteo
from ..errors import ConfigError

HELP = "write synthetic Criteo-format data drawn from a hidden logistic model"


def add_arguments(p):
    p.add_argument("out", metavar="OUT", help="file to write")
    p.add_argument("--rows", type=int, required=True, metavar="N", help="number of rows")
    p.add_argument("--seed", type=int, default=0, help="same seed, same data and hidden model (default 0)")
    p.add_argument("--format", choices=["criteo"], default="criteo",
                   help="criteo: label, 13 integer and 26 hex categorical columns, tab-separated")
    p.add_argument("--zipf-a", type=float, default=1.2, metavar="A",
                   help="skew of the categorical values (default 1.2; larger = fewer common values)")


def run(args) -> int:
    if args.rows < 0:
        raise ConfigError(f"--rows must be >= 0, got {args.rows}")
    try:
        report = generate_criteo(args.out, args.rows, seed=args.seed, zipf_a=args.zipf_a)
    except OSError as exc:  # missing or unwritable directory: a user error, not a crash
        raise ConfigError(f"{exc.filename or args.out}: {exc.strerror}") from exc
    print(f"wrote {report.rows} rows to {report.path} (seed {args.seed})")
    print(f"click rate {report.click_rate:.4f}")
    print(f"hidden-model AUC {report.hidden_auc:.4f}, log loss {report.hidden_logloss:.4f} "
          "(the best any model can reach on this data)")
    return 0
