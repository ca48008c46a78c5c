"""Is the model learning? Two checks the app warns on, with what to do.

- ``loss_fell``: over an epoch, the mean loss of the last fifth of the steps
  against the first fifth. A model whose training loss does not fall is not
  learning at these learning rates (too small: it barely moves; too large: it
  jumps around).
- ``beats_the_base_rate``: the validation log loss against the log loss of
  always predicting the training positive rate. A model that does no better has
  learnt nothing a constant would not.
"""
from __future__ import annotations

import math

import numpy as np

TREND_FRACTION = 0.2
MIN_STEPS = 10           # fewer steps say nothing about a trend


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
