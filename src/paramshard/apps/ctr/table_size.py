"""Defaults that scale with the table: the validation hold-out and the patience of model selection.

The app's first defaults (10% held out, the rates x0.1 after one epoch without a gain, a stop
after two) are the CTR benchmark suites', tuned on tables of millions of rows, where 10% is
100k validation rows and an epoch is thousands of steps. On a 3.6k-row table (issue 32) they
held out 366 rows, an AUC measured with a standard error of about 0.026 (Hanley & McNeil, AUC
0.85, a quarter positives) - more than the gain of one epoch - so the "best epoch" was often
noise: one seed stopped with epoch 1 as its best. An epoch there is 12 steps, so one unlucky
validation score decayed the rates for good. Hence, when the flag is not given:

- ``--valid-fraction``: max(10%, MIN_VALID_ROWS rows), at most MAX_VALID_SHARE of --train.
  1,000 rows measure that AUC to about 0.016; more than a quarter of a small table would
  take too much from training (3.6k rows: 900 held out, not 366).
- ``--patience``: PATIENCE (2) epochs without a better validation score, or SMALL_PATIENCE (4)
  on a table of fewer than SMALL_TABLE_ROWS rows, whose epochs are short and noisy.
- ``--lr-decay-after``: the rates decay after every patience // 2 epochs (at least 1) without
  improvement: after each such epoch with the large-table patience of 2 (as before), after
  every second one with 4 - one decay, then a stop, never a decay on a single bad score.
- ``--epochs``: 10, or on a small table enough epochs for MIN_BATCHES (200) batches of
  --batch-size over the rows trained on, at most MAX_EPOCHS (100). An epoch of the OJ
  table's 856 training rows (a quarter held out) is 3 batches of 256: ten epochs, 30 steps,
  stopped logistic regression far from its best (fixed-epoch runs peak after about 25
  epochs); early stopping still ends a run whose validation score stops improving, and
  epochs there cost milliseconds.

Rows are --train's data rows (bad lines included, as the readers count them), the same count
in every trainer, so every trainer settles on the same split without talking; counting stops
past SMALL_TABLE_ROWS (every default is the large table's from there: a big --train is not
read through for it). An explicit flag always wins.
"""
from __future__ import annotations

import math

DEFAULT_EPOCHS = 10
MIN_BATCHES, MAX_EPOCHS = 200, 100
DEFAULT_VALID_FRACTION = 0.1
MIN_VALID_ROWS = 1000
MAX_VALID_SHARE = 0.25
SMALL_TABLE_ROWS = 100_000
PATIENCE, SMALL_PATIENCE = 2, 4


def valid_fraction(rows: int) -> float:
    """The part of --train held out for validation when --valid-fraction is not given."""
    if rows <= 0:
        return DEFAULT_VALID_FRACTION
    return min(max(DEFAULT_VALID_FRACTION, MIN_VALID_ROWS / rows), MAX_VALID_SHARE)


def patience(rows: int) -> int:
    """Epochs without a better validation score that stop training, when --patience is not given."""
    return SMALL_PATIENCE if rows < SMALL_TABLE_ROWS else PATIENCE


def epochs(rows: int, batch_size: int, valid_share: float) -> int:
    """The epoch cap when --epochs is not given: DEFAULT_EPOCHS, or on a small table enough epochs
    for MIN_BATCHES batches of ``batch_size`` over the rows trained on (at most MAX_EPOCHS)."""
    trained = rows * (1 - valid_share)
    if rows <= 0 or rows >= SMALL_TABLE_ROWS or trained < 1:
        return DEFAULT_EPOCHS
    return min(MAX_EPOCHS, max(DEFAULT_EPOCHS, math.ceil(MIN_BATCHES * batch_size / trained)))


def decay_after(patience_epochs: int) -> int:
    """Epochs without improvement before each learning-rate decay, when --lr-decay-after is not given."""
    return max(1, patience_epochs // 2)


def settle(args, rows: int) -> str:
    """Scale the flags ``resolve`` left to the table's size (``args.scaled``) to ``rows``, in
    place (``args.selection`` too); a line saying what changed and why, or ""."""
    from paramshard.apps.ctr.selection import Selection
    left = set(getattr(args, "scaled", ()))
    chosen = []
    if "valid_fraction" in left and args.valid is None:
        args.valid_fraction = valid_fraction(rows)
        if args.valid_fraction != DEFAULT_VALID_FRACTION:
            chosen.append(f"{args.valid_fraction:.3g} held out for validation (at least {MIN_VALID_ROWS:,} rows, at "
                          f"most {MAX_VALID_SHARE:g} of them)")
    if "patience" in left:
        args.patience = patience(rows)
        if args.patience != PATIENCE:
            chosen.append(f"patience {args.patience}")
    if "lr_decay_after" in left:
        args.lr_decay_after = decay_after(args.patience)
        if args.lr_decay_after != 1 and args.lr_decay < 1:
            chosen.append(f"learning rates decayed after every {args.lr_decay_after} epochs without improvement")
    if "epochs" in left:
        args.epochs = epochs(rows, args.batch_size, 0.0 if args.valid is not None else args.valid_fraction)
        if args.epochs != DEFAULT_EPOCHS:
            chosen.append(f"at most {args.epochs} epochs (enough for {MIN_BATCHES} batches of {args.batch_size}, "
                          f"early stopping ends it sooner)")
    args.selection = Selection(args.monitor, args.patience, args.lr_decay, args.lr_decay_after)
    if not chosen:
        return ""
    return (f"{rows:,} rows in --train, a small table: {', '.join(chosen)} (apps/ctr/table_size.py; a flag given "
            f"explicitly wins)")
