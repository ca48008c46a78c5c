"""Refit on a small table: after model selection, a fresh model trained on ALL of --train for
the best epoch count, with the same seed and the same learning-rate decays, is the run's model.

Why: selection needs a hold-out, and on a small table the hold-out is a large part of the
data (a quarter of the ISLP OJ table's 856 training rows: table_size.py caps it there). The
best epoch's model never saw those rows. Once the hold-out has said how many epochs to
train (E) and when the rates decayed, it has done its job: the model trained the same way on
every row is better (a third more data on OJ; +0.005 to +0.01 AUC there), as
scikit-learn's ``*CV`` estimators refit on the whole set after choosing on folds. On a large
table 10% held out costs nothing measurable and a second run costs as much as the first, so
``auto`` refits only below table_size.SMALL_TABLE_ROWS rows.

The refit is the run the user could have typed: ``--valid-fraction 0 --epochs E --lr-decay-at
D`` (D: the epochs after which the selection run decayed, those before E), the same seed and
everything else alike: its figures equal that run's (tests/integration/test_ctr_app_refit.py).

Several hold-outs on a tiny table: when a quarter of --train (the cap of table_size.py) is
fewer than MIN_VALID_ROWS rows, one hold-out's scores are too noisy to pick an epoch (on OJ:
214 rows; the best epoch of DeepFM went from 3 to 7 by seed). Then up to MAX_HOLDOUTS
selection runs hold out other rows (another seed of the hold-out, the same model seed), each
without decays (one schedule for all of them and the refit), and the epoch count is the one
whose validation score averaged over them is best (over the epochs every one of them ran).
Measured on OJ (benchmarks/app_defaults.py): DeepFM 0.8945 with one hold-out and its decays,
0.8989 with five. Counting the rarer label's rows too (Caravan: 60 positives in 1,000 held
out) was tried and not kept: five hold-outs there scored 0.7582/0.7334 (lr/DeepFM) against
0.7546/0.7423 with one, within that test set's noise (70 positives: +-0.03 AUC).

Where: one process (``python -m paramshard.apps.ctr``): the refit is a second standalone job
in the same interpreter (runtime.init starts one per call: a fresh in-process server, fresh
tables, dense values and optimizer state). A launched job's servers hold the selection run's
tables and dense values, and the job has no way yet to start a fresh model under the same
trainers: there ``auto`` says so and keeps the best epoch's model, ``always`` is refused.
"""
from __future__ import annotations

import copy
import math
import statistics

from paramshard.errors import ConfigError
from paramshard.apps.ctr import table_size

MODES = ("auto", "always", "never")
MAX_HOLDOUTS = 5
HOLDOUT_SEED_STEP = 1_000_003     # repeat k holds out by seed + k * this (another draw of rows)


def decay_epochs(text) -> tuple[int, ...] | None:
    """--lr-decay-at "2,5" as (2, 5), sorted, each >= 1; None when not given."""
    if text is None or isinstance(text, tuple):
        return text
    try:
        epochs = tuple(sorted({int(e) for e in str(text).split(",") if e.strip()}))
    except ValueError:
        raise ConfigError(f"--lr-decay-at {text!r}: expected epoch numbers like 3,6") from None
    if any(e < 1 for e in epochs):
        raise ConfigError(f"--lr-decay-at {text!r}: epochs count from 1")
    return epochs


def why_not(args, standalone: bool) -> str | None:
    """Why this run cannot refit (None: it can)."""
    if args.valid is not None:
        return "validation comes from --valid files, so every --train row trains already"
    if not args.valid_fraction:
        return "--valid-fraction 0: no hold-out, every --train row trains already"
    if args.lr_decay_at is not None:
        return "--lr-decay-at is given (a fixed schedule, what a refit itself runs)"
    if not standalone:
        return ("a launched job's servers hold the selection run's tables and dense values, and a fresh model "
                "under the same trainers is not supported yet; the best epoch's model is the run's (run small "
                "tables in one process, `python -m paramshard.apps.ctr`, to refit)")
    return None


def refuse_launched(args) -> None:
    """`paramshard launch` checks the app's arguments before it starts any process: --refit
    always cannot run in a launched job, said then rather than by every trainer."""
    if args.refit == "always":
        raise ConfigError(f"--refit always: {why_not(args, standalone=False)}; use --refit auto or never")


def settle(args, rows: int, standalone: bool) -> str:
    """Decide whether this run refits (``args.refit_planned``), from --refit, --train's rows
    (counted up to table_size.SMALL_TABLE_ROWS) and the mode; the line that says so, or "".
    ConfigError for --refit always where a refit cannot run."""
    args.refit_planned, args.holdouts = False, 1
    if args.refit == "never":
        return ""
    reason = why_not(args, standalone)
    if args.refit == "always":
        if reason is not None:
            raise ConfigError(f"--refit always: {reason}; use --refit auto or never")
        args.refit_planned = True
        return (f"refit: after selection, a fresh model trains on all of --train for the best epoch count "
                f"(--refit always)")
    small = rows < table_size.SMALL_TABLE_ROWS
    if not small:
        return ""           # a large table: the hold-out costs nothing measurable, no second run
    if reason is not None:
        # Said only where the user did not choose it: a launched job (the others name their flag).
        return "" if args.valid is not None or not args.valid_fraction or args.lr_decay_at else \
            f"no refit on this small table: {reason}"
    args.refit_planned = True
    args.holdouts = holdouts(args, rows)
    if args.holdouts > 1:
        # One schedule for every hold-out and the refit: none (a plateau of a tiny hold-out is noise).
        from paramshard.apps.ctr.selection import Selection
        args.lr_decay = 1.0
        args.selection = Selection(args.monitor, args.patience, args.lr_decay, args.lr_decay_after)
        held = round(rows * args.valid_fraction)
        return (f"refit: {args.holdouts} hold-outs of {held:,} rows each (fewer than {table_size.MIN_VALID_ROWS:,} "
                f"rows: one is too noisy to pick an epoch), trained without decays, pick the epoch count whose mean "
                f"validation {args.monitor} is best; then a fresh model trains on all {rows:,} rows of --train for "
                f"it, same seed, and is the run's model (--refit never: one hold-out, the best epoch's model)")
    return (f"refit: after selection, a fresh model trains on all {rows:,} rows of --train (the hold-out too) for "
            f"the best epoch count, same seed and decays, and is the run's model (--refit never: the best epoch's)")


def holdouts(args, rows: int) -> int:
    """How many hold-outs pick the epoch count: 1, or on a table too small for a hold-out of
    MIN_VALID_ROWS (the fraction left out, capped at a quarter: fewer than 4,000 rows) enough
    that together they score MIN_VALID_ROWS rows, at most MAX_HOLDOUTS. An explicit
    --valid-fraction is one hold-out, as asked."""
    held = rows * args.valid_fraction
    if "valid_fraction" not in getattr(args, "scaled", ()) or held <= 0 or held >= table_size.MIN_VALID_ROWS:
        return 1
    return min(MAX_HOLDOUTS, math.ceil(table_size.MIN_VALID_ROWS / held))


def repeat_args(args, k: int):
    """Hold-out ``k`` of a repeated selection: other rows held out (k > 0), the same model seed,
    no decays (one schedule for every repeat and the refit), no export, --json or audit."""
    again = copy.copy(args)
    again.holdout_seed = args.seed + k * HOLDOUT_SEED_STEP
    again.lr_decay, again.refit, again.json, again.export, again.trained_log = 1.0, "never", None, None, None
    return again


def pooled_best(outs: list[dict], monitor: str) -> tuple[int, list[float]]:
    """The epoch count whose validation score, averaged over the hold-outs, is best (over the
    epochs every hold-out ran: each stopped on its own patience), and that mean curve."""
    from paramshard.apps.ctr.selection import MONITORS
    curves = [[e["valid"][monitor] for e in o["epochs"]] for o in outs]
    mean = [statistics.fmean(c[i] for c in curves) for i in range(min(map(len, curves)))]
    pick = max if MONITORS[monitor] else min
    return 1 + pick(range(len(mean)), key=lambda i: (mean[i], -i) if MONITORS[monitor] else (mean[i], i)), mean


def schedule(out: dict) -> tuple[int, tuple[int, ...]]:
    """From the selection run's result: the epochs to refit for and the decays before them."""
    epochs = int(out["best_epoch"])
    return epochs, tuple(e for e in out.get("lr_decays", ()) if e < epochs)


def refit_args(args, epochs: int, decays: tuple[int, ...]):
    """The refit's arguments: the selection run's, on all of --train, for ``epochs``, decaying
    after ``decays`` - what ``--valid-fraction 0 --epochs E --lr-decay-at D`` gives."""
    again = copy.copy(args)
    again.valid, again.valid_fraction, again.epochs, again.lr_decay_at = None, 0.0, epochs, decays
    again.refit, again.refit_planned, again.scaled, again.is_refit = "never", False, [], True
    again.json = None              # the selection run's --json carries the refit's figures
    again.trained_log = None       # the audit is of the selection run's epochs
    return again


def flags(epochs: int, decays: tuple[int, ...]) -> str:
    return (f"--valid-fraction 0 --epochs {epochs}"
            + (f" --lr-decay-at {','.join(map(str, decays))}" if decays else " --lr-decay 1"))


def train(args, say) -> dict | None:
    """The app's run: selection (training.train), then, when planned, the refit; the result's
    ``final`` figures are those of the model the run keeps, ``final_model`` says which."""
    from paramshard.apps.ctr import training
    out = training.train(args, say)     # selection (settle() decides on the refit at its start)
    if out is None:
        return None
    if not getattr(args, "refit_planned", False):
        out["final_model"] = "best epoch"
        return out
    if args.holdouts > 1:
        return repeated(args, say, out)
    return refit(args, say, out, *schedule(out))


def one_process(out: dict | None) -> dict:
    """A standalone run's result: its one trainer is trainer 0, which always has one."""
    if out is None:
        raise AssertionError("a refit runs in one process, whose trainer 0 returns the run's result")
    return out


def repeated(args, say, first: dict) -> dict:
    """Selection on the other hold-outs (``first``: the seed's own), the epoch count from their
    mean curve, the refit."""
    from paramshard.apps.ctr import training
    count, outs = args.holdouts, [first]
    for k in range(1, count):
        outs.append(one_process(training.train(repeat_args(args, k),
                                               lambda text, k=k: say(f"hold-out {k + 1}/{count}: {text}"))))
    epochs, mean = pooled_best(outs, args.monitor)
    out = outs[0]           # the seed's own hold-out: its epochs are the run's history
    out["settings"].update(refit=args.refit, refit_planned=True, holdouts=count)
    out["holdouts"] = {"count": count, "best_epochs": [o["best_epoch"] for o in outs], "mean_valid": mean,
                       "epochs": epochs}
    say(f"{count} hold-outs: best epochs {', '.join(str(o['best_epoch']) for o in outs)}; the mean validation "
        f"{args.monitor} is best after {epochs} epoch(s) ({mean[epochs - 1]:.4f})")
    return refit(args, say, out, epochs, ())


def refit(args, say, out: dict, epochs: int, decays: tuple[int, ...]) -> dict:
    """The refit after selection: its model's figures are the run's (``final``)."""
    from paramshard.apps.ctr import training
    say(f"refit: a fresh model on all of --train for {epochs} epoch(s) (the best epoch count), seed {args.seed}, "
        f"learning rates x {args.lr_decay:g} after {'epochs ' + ', '.join(map(str, decays)) if decays else 'no epoch'}"
        f": as `{flags(epochs, decays)}` would")
    again = one_process(training.train(refit_args(args, epochs, decays), lambda text: say(f"refit: {text}")))
    out["refit"] = {"epochs": epochs, "lr_decays": list(decays), "flags": flags(epochs, decays),
                    "history": again["epochs"], "final": again["final"]}
    out["final"] = again["final"]
    out["final_model"] = "refit"
    say(f"the run's model is the refit's (test {training.figures_text(again['final'])}; the best epoch's, trained "
        f"without the hold-out: {training.figures_text(out['best'])})")
    return out
