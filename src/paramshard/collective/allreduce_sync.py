"""``AllreduceDenseSync``: the DenseSync of collective and hybrid modes.

The gradients it is given were already averaged over the trainers by allreduce
(DDP, during the backward: ``data_parallel.py``), so every trainer holds the same
ones; each applies the update rule the servers would apply (update_rules/rules.py,
the same code: the same maths as sync mode, step for step) to its replica, and the
replicas stay equal without sending any value. The chief's starting values reach
the others when DDP is built (a broadcast from trainer 0).

A table every trainer holds whole (models/hashed.py) is trained as a
SparseEmbedding is on the servers: with its own optimizer (``tables``: name ->
(config, row width)), on the rows the step touched only (a row no trainer looked
up this step keeps its value and its state, weight decay included), so a CTR
model's tables learn with the same settings in every mode.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

import numpy as np

from paramshard.errors import ConfigError
from paramshard.optim import OptimizerConfig, check_dense, check_lr_scale, scaled
from paramshard.update_rules import make_rule


class AllreduceDenseSync:
    def __init__(self, optimizer: OptimizerConfig, values: Mapping[str, np.ndarray],
                 tables: Mapping[str, tuple[OptimizerConfig, int]] | None = None):
        check_dense(optimizer, "the dense optimizer")
        self.optimizer = optimizer
        self.lr_scale = 1.0          # the rule runs at optimizer.lr x lr_scale, as a server's does
        self.rule = make_rule(optimizer)
        self.table_configs = {name: (config, int(width)) for name, (config, width) in (tables or {}).items()}
        self.table_rules = {name: (make_rule(config), width) for name, (config, width) in self.table_configs.items()}
        unknown = set(self.table_rules) - set(values)
        if unknown:
            raise ConfigError(f"tables {sorted(unknown)} are not parameters of the model")
        self.slots = {}
        for name, v in values.items():
            rule, width = self.table_rules.get(name, (self.rule, None))
            self.slots[name] = rule.init_slots(v.shape if width is None else (v.size // width, width))
        self.updates = 0

    def set_lr_scale(self, scale: float) -> None:
        """Every trainer, at the same step: updates from the next one on run at the base rate x
        ``scale`` (Trainer.scale_learning_rate), so the replicas stay equal. The tables with their
        own optimizer (hashed tables: collective mode's stand-in for the servers' tables) too."""
        self.rule = make_rule(scaled(self.optimizer, check_lr_scale(scale, "the dense optimizer")))
        self.table_rules = {name: (make_rule(scaled(config, check_lr_scale(scale, f"table {name}"))), width)
                            for name, (config, width) in self.table_configs.items()}
        self.lr_scale = float(scale)

    def register_dense(self, values: Mapping[str, np.ndarray], optimizer: OptimizerConfig,
                       timeout: float | None = None) -> None:
        """Nothing to send: DDP broadcast the chief's values when it was built."""

    def pull_dense(self, out: Mapping[str, np.ndarray], min_version: int, timeout: float | None = None) -> int:
        """The replica in ``out`` is the job's: nothing to fetch."""
        if min_version > self.updates:
            raise ConfigError(f"pull_dense(min_version={min_version}): this replica holds {self.updates} updates")
        return self.updates

    def push_dense(self, grads: Mapping[str, np.ndarray], step: int, out: Mapping[str, np.ndarray] | None = None,
                   timeout: float | None = None) -> None:
        if out is None:
            raise ConfigError("AllreduceDenseSync.push_dense needs the parameters (out=) it updates")
        self.updates += 1
        for name, grad in grads.items():
            if name in self.table_rules:
                self._apply_rows(name, out[name], grad)
            else:
                self.rule.apply(out[name], grad, self.slots[name], self.updates)

    def _apply_rows(self, name: str, param: np.ndarray, grad: np.ndarray) -> None:
        """The table's rule on the rows with a gradient (the ids looked up this step)."""
        rule, width = self.table_rules[name]
        grad = grad.reshape(-1, width)
        rows = np.flatnonzero(np.any(grad != 0, axis=1))
        if not len(rows):
            return
        table = param.reshape(-1, width)
        values, slots = table[rows], [s[rows] for s in self.slots[name]]
        rule.apply(values, grad[rows], slots, self.updates)
        table[rows] = values
        for whole, part in zip(self.slots[name], slots):
            whole[rows] = part


if TYPE_CHECKING:   # `make typecheck` checks the contract: DenseSync (dense_sync.py)
    from paramshard.dense_sync import DenseSync
    _dense_sync: type[DenseSync] = AllreduceDenseSync
