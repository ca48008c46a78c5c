"""Optimizer configs a user hands to the Trainer; the servers run the update.

Frozen, validated on creation, and sent to servers as a plain map (never
pickled). The update rules live in paramshard.update_rules and follow
torch.optim's formulas, so a server-side Adam matches torch.optim.Adam.
"""
from __future__ import annotations

import dataclasses
import math
import typing

import numpy as np

from paramshard.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    lr: float = 0.01
    weight_decay: float = 0.0

    kind = "base"
    # Set for rules that keep state per table row rather than per element: only a
    # SparseEmbedding table takes them, never the Trainer's dense optimizer. Names the
    # optimizer dense parameters should use instead.
    dense_alternative: typing.ClassVar[str | None] = None

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type.startswith("tuple") if isinstance(f.type, str) else f.type is tuple:
                if not isinstance(value, tuple):
                    raise ConfigError(f"{type(self).__name__}({f.name}={value!r}): must be a tuple")
                continue      # its own check follows in the subclass
            if f.type in (bool, "bool"):
                if not isinstance(value, bool):
                    raise ConfigError(f"{type(self).__name__}({f.name}={value!r}): must be True or False")
                continue
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) \
                    or value < 0:
                raise ConfigError(f"{type(self).__name__}({f.name}={value!r}): must be a finite number >= 0")
        if self.lr <= 0:
            raise ConfigError(f"{type(self).__name__}(lr={self.lr}): the learning rate must be > 0")

    def to_wire(self) -> dict:
        out: dict[str, typing.Any] = {"kind": self.kind}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out


@dataclasses.dataclass(frozen=True)
class SGD(OptimizerConfig):
    kind = "sgd"


@dataclasses.dataclass(frozen=True)
class Momentum(OptimizerConfig):
    momentum: float = 0.9
    nesterov: bool = False
    kind = "momentum"


@dataclasses.dataclass(frozen=True)
class Adagrad(OptimizerConfig):
    lr_decay: float = 0.0
    initial_accumulator_value: float = 0.0
    eps: float = 1e-10
    kind = "adagrad"


@dataclasses.dataclass(frozen=True)
class Adam(OptimizerConfig):
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    kind = "adam"

    def __post_init__(self):
        super().__post_init__()
        if len(self.betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in self.betas):
            raise ConfigError(f"Adam(betas={self.betas}): two numbers in [0, 1)")


@dataclasses.dataclass(frozen=True)
class FTRL(OptimizerConfig):
    """FTRL-Proximal (McMahan et al. 2013), the classic sparse CTR optimizer."""
    lr: float = 0.05        # alpha
    beta: float = 1.0
    l1: float = 0.0
    l2: float = 0.0
    kind = "ftrl"


@dataclasses.dataclass(frozen=True)
class RowWiseAdagrad(OptimizerConfig):
    """Adagrad with one accumulator per table row (FBGEMM's EXACT_ROWWISE_ADAGRAD): the
    accumulator grows by the mean of the row gradient's squares, and the whole row takes
    one step size. Its state is one float32 per row instead of one per element (4 bytes
    instead of 64 for a dim-16 row). For SparseEmbedding tables only: dense parameters
    use ``Adagrad``. The exact float32 arithmetic: update_rules.rules.RowWiseAdagradRule."""
    initial_accumulator_value: float = 0.0
    eps: float = 1e-10
    kind = "rowwise_adagrad"
    dense_alternative = "Adagrad"


KINDS = {cls.kind: cls for cls in (SGD, Momentum, Adagrad, Adam, FTRL, RowWiseAdagrad)}
DENSE_KINDS = {kind: cls for kind, cls in KINDS.items() if cls.dense_alternative is None}


def check_dense(config: OptimizerConfig | type[OptimizerConfig], where: str) -> None:
    """A ConfigError when ``config`` (or its class) cannot update dense parameters: a rule
    with per-row state (RowWiseAdagrad), for SparseEmbedding tables only."""
    if config.dense_alternative is not None:
        name = config.__name__ if isinstance(config, type) else type(config).__name__
        raise ConfigError(f"{where}: {name} is for SparseEmbedding tables; dense parameters: use "
                          f"{config.dense_alternative} (ps.optim.{config.dense_alternative}; {name} keeps one "
                          f"accumulator per table row, there are no rows in a dense parameter)")


_F32 = np.finfo(np.float32)
MAX_LR_FACTOR = 1e6      # one learning-rate change multiplies by at most this (a typo guard, not maths)


def check_lr_factor(factor, what: str = "scale_learning_rate") -> float:
    """A learning-rate factor: a finite number, 0 < factor <= MAX_LR_FACTOR."""
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) \
            or not 0 < factor <= MAX_LR_FACTOR:
        raise ConfigError(f"{what}({factor!r}): the factor must be a finite number, 0 < factor <= "
                          f"{MAX_LR_FACTOR:g} (e.g. 0.5 halves the learning rate)")
    return float(factor)


def check_lr_scale(scale, what: str) -> float:
    """A learning-rate scale (the product of the factors so far): a finite number > 0."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ConfigError(f"{what}: a learning-rate scale must be a finite number > 0, got {scale!r}")
    return float(scale)


def scaled(config: OptimizerConfig, scale: float) -> OptimizerConfig:
    """``config`` with its learning rate multiplied by ``scale`` (the base rate x the product of
    every factor so far, in float64: what torch computes for ``group["lr"] = lr * scale``).
    ConfigError when the rate would no longer be a positive float32 (the rules compute in it)."""
    if scale == 1.0:
        return config
    lr = config.lr * scale
    if not _F32.smallest_subnormal <= lr <= _F32.max:
        raise ConfigError(f"a learning rate of {config.lr:g} x {scale:g} = {lr:g} is not a positive float32 "
                          f"number: scale it less")
    return dataclasses.replace(config, lr=lr)


def from_wire(data: dict) -> OptimizerConfig:
    """Rebuild a config from a received map; every key is checked."""
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str) or data["kind"] not in KINDS:
        raise ConfigError(f"optimizer {data!r}: 'kind' must be one of {sorted(KINDS)}")
    cls = KINDS[data["kind"]]
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names - {"kind"}
    if unknown:
        raise ConfigError(f"optimizer {data['kind']}: unknown settings {sorted(unknown)}")
    kwargs: dict[str, typing.Any] = {k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items() if k != "kind"}
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"optimizer {data['kind']}: {exc}") from None
