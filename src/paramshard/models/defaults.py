"""What each CTR model trains with by default: one place for the library and the CTR app.

Architecture defaults (``dim``, ``hidden``, ``cross_layers``) are the model
classes' own keyword defaults, read from their signatures, so
``build_model("deepfm", schema)`` and ``python -m paramshard.apps.ctr --model
deepfm`` build the same network. Training defaults are here:

- ``lr``: Adam's learning rate for the dense parameters (MLP, cross layers,
  the dense features' linear term);
- ``table_lr``: Adagrad's learning rate for the tables' rows.

Logistic regression has no MLP to absorb a slow start and one weight per id:
at the deep models' rates it barely moves in an epoch on a small table (AUC
below 0.5 on 5k rows), so it takes ten times their rates, as FTRL-style linear
CTR models do. docs/training.md lists these; benchmarks/public_tables.py
measures them on three public datasets without any tuning.
"""
from __future__ import annotations

import dataclasses
import inspect

from ..errors import ConfigError

ARCHITECTURE = ("dim", "hidden", "cross_layers")


@dataclasses.dataclass(frozen=True)
class TrainingDefaults:
    lr: float = 3e-3            # Adam, dense parameters
    table_lr: float = 0.05      # Adagrad, table rows
    batch_size: int = 256       # rows per step per trainer


TRAINING = {
    "lr": TrainingDefaults(lr=3e-2, table_lr=0.5),
    "widedeep": TrainingDefaults(),
    "deepfm": TrainingDefaults(),
    "dcn": TrainingDefaults(),
}


def training_defaults(name: str) -> TrainingDefaults:
    found = TRAINING.get(name)
    if found is None:
        raise ConfigError(f"no training defaults for model {name!r}: one of {', '.join(sorted(TRAINING))}")
    return found


def architecture_defaults(cls) -> dict:
    """The class's own defaults for the architecture arguments it takes (none for LR)."""
    params = inspect.signature(cls.__init__).parameters
    return {name: params[name].default for name in ARCHITECTURE if name in params}
