"""Is the model learning? Two checks the app warns on, with what to do.

- ``loss_fell``: over an epoch, the mean loss of the last fifth of the steps
  against the first fifth. A model whose training loss does not fall is not
  learning at these learning rates (too small: it barely moves; too large: it
  jumps around).
- ``beats_the_base_rate``: the validation log loss against the log loss of
  always predicting the training positive rate. A model that does no better has
  learnt nothing a constant would not.
- ``overfitting``: epochs in a row in which the training loss fell while the validation
  log loss rose, each against the epoch before. Two of them (OVERFIT_EPOCHS) are a trend,
  not one noisy score: the model learns the training rows by heart (issue 32: a row-id
  column kept as a category drove DeepFM's training loss to 0.002 while the test log loss
  rose), and more epochs only make it worse.
"""
from __future__ import annotations

import math

import numpy as np

TREND_FRACTION = 0.2
MIN_STEPS = 10           # fewer steps say nothing about a trend
OVERFIT_EPOCHS = 2       # epochs in a row of falling training loss and rising validation loss


def loss_fell(losses: list[float]) -> tuple[bool, float, float] | None:
    """(fell, first, last): mean loss of the first and last fifth of the epoch; None when
    the epoch has too few steps to tell."""
    if len(losses) < MIN_STEPS:
        return None
    k = max(1, int(len(losses) * TREND_FRACTION))
    first, last = float(np.mean(losses[:k])), float(np.mean(losses[-k:]))
    return last < first, first, last


def base_rate_logloss(positive_rate: float) -> float:
    p = min(max(positive_rate, 1e-15), 1 - 1e-15)
    return -(p * math.log(p) + (1 - p) * math.log(1 - p))


def beats_the_base_rate(logloss: float, positive_rate: float) -> bool:
    return logloss < base_rate_logloss(positive_rate)


def overfitting(history: list[tuple[int, float, float]]) -> tuple[int, int] | None:
    """``history``: (epoch, training loss, validation log loss) in epoch order. (first, last):
    the epochs of the stretch at the end of the history over which the training loss fell and
    the validation log loss rose every epoch, when exactly OVERFIT_EPOCHS epochs rose (so a
    long stretch is named once, when it becomes one); else None. A NaN breaks a stretch."""
    rising = 0
    for before, after in zip(reversed(history[:-1]), reversed(history[1:])):
        if not (after[1] < before[1] and after[2] > before[2]):
            break
        rising += 1
    if rising != OVERFIT_EPOCHS:
        return None
    return history[-1 - rising][0], history[-1][0]
