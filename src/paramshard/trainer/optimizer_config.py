"""What the user passes as ``Trainer(optimizer=...)``, turned into a ps.optim config.

Optimizers run on the servers, so the Trainer takes a ``ps.optim`` config. A
torch.optim optimizer, a config class instead of an instance, or anything else
gets an error that shows the ``ps.optim`` call to use (the common torch
optimizers' hyper-parameters mapped over). A table-only optimizer (RowWiseAdagrad:
one accumulator per row) is refused, naming the dense one to use.
"""
from __future__ import annotations

import torch

from paramshard.errors import ConfigError
from paramshard.optim import DENSE_KINDS, SGD, OptimizerConfig, check_dense


def _fmt(value) -> str:
    if isinstance(value, torch.Tensor):
        value = value.item()
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_fmt(v) for v in value) + ")"
    return repr(value)


def _ps_equivalent(optimizer) -> str | None:
    """The ps.optim call matching a torch.optim optimizer's first param group, or None."""
    if not isinstance(optimizer, torch.optim.Optimizer) or not optimizer.param_groups:
        return None
    g = optimizer.param_groups[0]

    def call(name, *keys):
        args = [f"{k}={_fmt(g[k])}" for k in keys if k in g]
        return f"ps.optim.{name}({', '.join(args)})"

    if type(optimizer) is torch.optim.SGD:
        if g.get("momentum", 0) > 0:
            return call("Momentum", "lr", "momentum", "nesterov", "weight_decay")
        return call("SGD", "lr", "weight_decay")
    if type(optimizer) is torch.optim.Adam:
        return call("Adam", "lr", "betas", "eps", "weight_decay")
    if type(optimizer) is torch.optim.Adagrad:
        return call("Adagrad", "lr", "lr_decay", "initial_accumulator_value", "eps", "weight_decay")
    return None


def optimizer_config(optimizer) -> OptimizerConfig:
    """``optimizer`` as a ps.optim config (None: SGD(lr=0.01)), or a ConfigError saying what to pass."""
    if optimizer is None:
        return SGD(lr=0.01)
    if isinstance(optimizer, OptimizerConfig):
        # A per-row rule (RowWiseAdagrad) belongs to SparseEmbedding(optimizer=...), not here.
        check_dense(optimizer, f"Trainer(optimizer=ps.optim.{type(optimizer).__name__}(...))")
        return optimizer
    available = ", ".join(f"ps.optim.{cls.__name__}" for cls in DENSE_KINDS.values())
    if isinstance(optimizer, type) and issubclass(optimizer, OptimizerConfig):
        check_dense(optimizer, f"Trainer(optimizer=ps.optim.{optimizer.__name__})")
        raise ConfigError(f"Trainer(optimizer=ps.optim.{optimizer.__name__}): pass an instance with its "
                          f"settings, e.g. optimizer=ps.optim.{optimizer.__name__}(lr=0.01)")
    if isinstance(optimizer, torch.optim.Optimizer):
        module = type(optimizer).__module__
        module = "torch.optim" if module.startswith("torch.optim") else module
        name = f"{module}.{type(optimizer).__name__}"
        equivalent = _ps_equivalent(optimizer)
        hint = (f"use optimizer={equivalent}" if equivalent else
                f"{name} has no paramshard equivalent; pick one of {available}")
        raise ConfigError(f"Trainer(optimizer={name}(...)): optimizers run on the parameter servers, so "
                          f"the Trainer takes a ps.optim config, not a torch.optim optimizer; {hint}")
    shown = repr(optimizer)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    raise ConfigError(f"Trainer(optimizer={shown}): expected a ps.optim config (optimizers run on the "
                      f"parameter servers), one of {available}, e.g. optimizer=ps.optim.SGD(lr=0.1)")
