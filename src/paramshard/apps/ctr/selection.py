"""Model selection over epochs, as the CTR benchmark suites (FuxiCTR/BARS) train: after each
epoch the validation metric says whether the model improved; every ``decay_after``-th epoch
without improvement in a row decays the learning rates (reduce on plateau), and ``patience`` of
them in a row stop training. The best epoch is the one whose model the app restores and exports
at the end. The app's defaults for both scale with the table (table_size.py): on a large table
a decay after each epoch without a gain and a stop after two (the benchmark suites' rule), on a
small one (short, noisy epochs) a decay after two and a stop after four.

A pure function of the validation scores so far, in epoch order: an epoch run again (a
rollback, a resume) replaces its score and every decision follows again from the list.
"""
from __future__ import annotations

import dataclasses
import math

from paramshard.errors import ConfigError

# name -> higher is better; the first four are a binary (or multi-task: their means over the
# tasks) label's, the last three a regression's (data/label_metrics.py).
MONITORS = {"auc": True, "logloss": False, "accuracy": True, "gauc": True, "rmse": False, "mse": False, "mae": False}
REGRESSION_MONITORS = ("rmse", "mse", "mae")


@dataclasses.dataclass(frozen=True)
class Decision:
    best_epoch: int          # index into the scores: the epoch whose model is kept
    improved: bool           # the last epoch is the best so far
    decay: bool              # multiply the learning rates by the decay factor now
    stop: bool               # no more epochs

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data) -> "Decision":
        try:
            return cls(int(data["best_epoch"]), bool(data["improved"]), bool(data["decay"]), bool(data["stop"]))
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"a selection decision must have best_epoch, improved, decay and stop: {data!r}") \
                from None


@dataclasses.dataclass(frozen=True)
class Selection:
    monitor: str = "auc"
    patience: int = 2            # epochs without improvement before stopping (0: never stop early)
    decay: float = 0.1           # learning-rate factor after an epoch without improvement (1: never)
    decay_after: int = 1         # decay after every this many epochs in a row without improvement
    min_delta: float = 1e-5      # a smaller gain is no improvement (noise of a finite validation set)

    def __post_init__(self):
        if self.monitor not in MONITORS:
            raise ConfigError(f"--monitor {self.monitor!r}: one of {', '.join(MONITORS)}")
        if self.patience < 0:
            raise ConfigError(f"--patience {self.patience}: must be >= 0 (0: never stop early)")
        if not 0 < self.decay <= 1:
            raise ConfigError(f"--lr-decay {self.decay}: must be in (0, 1] (1: never decay)")
        if self.decay_after < 1:
            raise ConfigError(f"--lr-decay-after {self.decay_after}: must be >= 1 (epochs without improvement "
                              f"before each decay)")

    def decide(self, scores: list[float]) -> Decision:
        if not scores:
            raise ConfigError("Selection.decide needs the score of at least one epoch")
        higher = MONITORS[self.monitor]
        best, since = 0, 0
        for epoch in range(1, len(scores)):
            gain = (scores[epoch] - scores[best]) if higher else (scores[best] - scores[epoch])
            if gain > self.min_delta or (math.isnan(scores[best]) and not math.isnan(scores[epoch])):
                best, since = epoch, 0
            else:
                since += 1
        improved = since == 0
        stop = self.patience > 0 and since >= self.patience
        decay = not improved and not stop and self.decay < 1 and since % self.decay_after == 0
        return Decision(best, improved, decay=decay, stop=stop)


def settle_monitor(args, schema) -> None:
    """--monitor for the schema's label kind: left out, rmse for a regression and auc otherwise
    (a multi-task run's: the mean AUC over its tasks); a metric the label has not is refused.
    ``args.selection`` follows."""
    regression = schema.label_kind == "regression"
    if not getattr(args, "monitor_given", True):
        args.monitor = "rmse" if regression else "auc"
    elif regression != (args.monitor in REGRESSION_MONITORS):
        what = (f"a regression label ({schema.label.column!r}) has {', '.join(REGRESSION_MONITORS)}" if regression
                else f"a {schema.label_kind} label has " + ", ".join(m for m in MONITORS if m not in REGRESSION_MONITORS))
        raise ConfigError(f"--monitor {args.monitor}: {what}; pick one of those (or leave --monitor out)")
    if regression and getattr(args, "group_by", None):
        raise ConfigError(f"--group-by {args.group_by}: GAUC is an AUC per group, and a regression label "
                          f"({schema.label.column!r}) has no AUC; leave --group-by out")
    args.selection = dataclasses.replace(args.selection, monitor=args.monitor)
