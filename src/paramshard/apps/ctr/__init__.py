"""Train a CTR model on any tabular file, no code: ``python -m paramshard.apps.ctr``.

    paramshard launch --servers 2 --trainers 2 -m paramshard.apps.ctr \\
        --train data/adult/train.csv --test data/adult/test.csv --schema adult.fitted.json \\
        --model deepfm --json runs/adult.json --export adult-model.pt
    python -m paramshard.apps.ctr ...        # the same in one process, no launcher

It trains as the CTR benchmark suites do: a validation split (--valid FILES, or
--valid-fraction of --train held out), validation metrics after every epoch,
learning rates decayed when epochs bring no improvement, early stopping
after --patience such epochs, and the best epoch's model restored at the end:
its test metrics are the run's result, --export writes it. The hold-out and the
patience left out scale with the table (table_size.py); --weight COL weights the
rows, --group-by COL adds GAUC. The label is what the schema says (docs/data.md
"Labels"): binary (AUC, log loss), real-valued (regression: MSE, RMSE, MAE; epochs
picked by RMSE) or several binary labels (multi-task: one head each, per-label
figures, epochs picked by the mean AUC). Learning rates,
batch size and architecture default to the chosen model's (models/defaults.py).

Every mode of the launcher works, with the same hyper-parameters: in hybrid mode
the tables stay on the servers and the dense part is averaged by allreduce; in
collective mode (no servers) every trainer holds hashed tables of --buckets rows
(models/hashed.py), trained with the same Adagrad as the servers' tables.
A schema without statistics is fitted by every trainer over all of --train
(the same rows, so the same result everywhere); `paramshard schema fit` once
beforehand saves that pass.
"""
from __future__ import annotations

import sys

from paramshard.errors import ParamshardError


def main(argv=None) -> int:
    from paramshard.apps.ctr import refit, training as run_module
    from paramshard.apps.ctr.options import parser, resolve
    import paramshard as ps

    args = resolve(parser(__doc__.split("\n\n")[0]).parse_args(argv))
    chief = ps.runtime.environment().trainer_id in (0, None)

    def say(text):
        if chief:
            print(text, flush=True)

    if args.stream:                     # issue 33: from a live stream, until stopped
        from paramshard.apps.ctr.stream import run as streaming
        out = streaming.train(args, say)
    else:
        out = refit.train(args, say)       # selection, then (small tables) the refit
    if out is not None and args.json:
        run_module.write_json(args.json, out)
        say(f"wrote {args.json}")
    return 0


def check_arguments(argv: list[str], files: bool = True) -> None:
    """What `paramshard launch -m paramshard.apps.ctr ARGS` checks before it starts any
    process (launch/rank/app_check.py): ConfigError if ARGS would not run."""
    from paramshard.apps.ctr.arguments import check_arguments as check
    check(argv, files, __doc__.split("\n\n")[0])


def run() -> int:
    try:
        return main()
    except ParamshardError as exc:
        print(f"paramshard.apps.ctr: error: {exc}", file=sys.stderr)
        return 1
