"""What each CTR model trains with by default: one place for the library and the CTR app.

Architecture defaults (``dim``, ``hidden``, ``cross_layers``, ...) are the model
classes' own keyword defaults, read from their signatures, so
``build_model("deepfm", schema)`` and ``python -m paramshard.apps.ctr --model
deepfm`` build the same network. Training defaults are here:

- ``lr``: Adam's learning rate for the dense parameters (MLP, cross layers,
  the dense features' linear term);
- ``table_lr``: Adagrad's learning rate for the tables' rows.

Logistic regression has no MLP and one weight per id: at the deep models' rates
it moves slowly (on MovieLens 100k it was still improving after 10 epochs), so it
takes ten times their dense rate and four times their table rate. Measured with
the app's early stopping (test AUC of the best epoch, one process):

    rates (lr, table_lr)   adult, 5k rows   movielens, 5k rows   movielens, 80k rows
    3e-3, 0.05             0.8873           0.6955               0.7715
    3e-2, 0.2              0.8967           0.6885               0.7753
    3e-2, 0.5              0.8878           0.6825               0.7743

(``python -m paramshard.apps.ctr --model lr --epochs 10 --lr A --table-lr B``,
first rows of `paramshard dataset adult|movielens100k`'s train.csv, their test.csv.)

docs/data.md lists these; benchmarks/public_tables.py measures every model on
three public datasets with them, no tuning.
"""
from __future__ import annotations

import dataclasses
import inspect

from paramshard.errors import ConfigError

# The app has flags for dim and hidden only; the others are listed so its first line and
# --json settings say what the model was built with (the class's defaults).
ARCHITECTURE = ("dim", "hidden", "cross_layers", "rank", "structure", "cin_layers", "split_half",
                "attention_layers", "heads", "head_dim", "attention_hidden", "max_len")


@dataclasses.dataclass(frozen=True)
class TrainingDefaults:
    lr: float = 3e-3            # Adam, dense parameters
    table_lr: float = 0.05      # Adagrad, table rows
    batch_size: int = 256       # rows per step per trainer


TRAINING = {
    "lr": TrainingDefaults(lr=3e-2, table_lr=0.2),
    "widedeep": TrainingDefaults(),
    "deepfm": TrainingDefaults(),
    "dcn": TrainingDefaults(),
    # The deep models' rates, not tuned per model. On Adult with the app's defaults (one process,
    # seed 0, test AUC of the best epoch): DeepFM 0.9096, DCNv2 0.9059, xDeepFM 0.9049, AutoInt
    # 0.9079, within the +-0.01 the seeds alone move a model there (issue 32).
    "dcnv2": TrainingDefaults(),
    "xdeepfm": TrainingDefaults(),
    "autoint": TrainingDefaults(),
    "din": TrainingDefaults(),
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
