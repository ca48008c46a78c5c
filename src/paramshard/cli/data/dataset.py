"""`paramshard dataset`: fetch a public tabular dataset as raw CSV files."""
from __future__ import annotations

from paramshard.data.datasets import DATASETS, LABELS, fetch

HELP = ("fetch a public tabular dataset as raw train/test CSV files (adult: UCI census income; movielens100k: "
        "ratings >= 4 with users and movies; bio_kdd04: KDD Cup 2004 protein homology; womens_clothing: is a "
        "reviewed item recommended; caravan: CoIL 2000 insurance purchases; oj: orange juice brand choice, 1,070 rows)")
EXAMPLE = "paramshard dataset adult data/adult"


def add_arguments(p):
    p.add_argument("name", choices=DATASETS)
    p.add_argument("out", metavar="DIR", help="directory for train.csv and test.csv")


def run(args) -> int:
    train, test = fetch(args.name, args.out)
    print(f"{args.name}: {train} and {test} (label column: {LABELS[args.name]})")
    return 0
