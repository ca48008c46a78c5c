"""Check a trained CTR model without servers: the test metric the training printed last.

    paramshard launch --servers 2 --trainers 2 --checkpoint-dir runs/ckpt examples/ctr_wide_deep.py
    paramshard export-model runs/ckpt --out model.pt
    python examples/evaluate.py --model model.pt

Give the same data options as the training run (--train-rows, --test-rows,
--workdir, or --data/--test, and --dim): this builds the same model, loads the
exported file into it (ps.load_model: no server, no cluster) and computes test
AUC and log loss on the same test set, printed as the training prints them.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import paramshard as ps  # noqa: E402
from paramshard.data import criteo_schema  # noqa: E402
from paramshard.models import WideDeep  # noqa: E402
from ctr_wide_deep import evaluate, parser, prepare_synthetic  # noqa: E402


def find_test_set(args) -> Path:
    """The test set of the training run these options describe."""
    if args.data or args.test:
        if not args.test:
            raise SystemExit("--data needs --test FILE: the test set the training evaluated on")
        return args.test
    # The synthetic test rows follow the training rows of one generated file, whatever the
    # number of shards the training split the rest into: any run's copy is the same.
    for ready in sorted(args.workdir.glob(f"synthetic-{args.train_rows}-{args.test_rows}-*shards/READY")):
        return ready.parent / "test.tsv"
    _, test, _ = prepare_synthetic(args.workdir, args.train_rows, args.test_rows, shards=1, trainer_id=0)
    return test


def main():
    p = parser()
    p.add_argument("--model", type=Path, required=True,
                   help="a file written by `paramshard export-model CHECKPOINT --out FILE`")
    p.add_argument("--unknown", choices=("initial", "zeros"), default="initial",
                   help="what an id the model never stored reads (default: initial, as in training)")
    args = p.parse_args()

    model = WideDeep(criteo_schema(), dim=args.dim, embedding=lambda name, dim: ps.SparseEmbedding(name, dim))
    try:
        ps.load_model(model, args.model, unknown=args.unknown)
    except ps.ParamshardError as exc:
        raise SystemExit(f"evaluate.py: {exc}") from None
    test_auc, test_loss = evaluate(model, find_test_set(args))
    print(f"test AUC {test_auc:.4f}  logloss {test_loss:.4f}  ({args.model}, no servers)", flush=True)


if __name__ == "__main__":
    main()
