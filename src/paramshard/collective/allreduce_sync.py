"""``AllreduceDenseSync``: the DenseSync of collective and hybrid modes.

The gradients it is given were already averaged over the trainers by allreduce
(DDP, during the backward: ``data_parallel.py``), so every trainer holds the same
ones; each applies the update rule the servers would apply (update_rules/rules.py,
the same code: the same maths as sync mode, step for step) to its replica, and the
replicas stay equal without sending any value. The chief's starting values reach
the others when DDP is built (a broadcast from trainer 0).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import ConfigError
from ..optim import OptimizerConfig, check_dense, check_lr_scale, scaled
from ..update_rules import make_rule


class AllreduceDenseSync:
    def __init__(self, optimizer: OptimizerConfig, values: Mapping[str, np.ndarray]):
        check_dense(optimizer, "the dense optimizer")
        self.optimizer = optimizer
        self.lr_scale = 1.0          # the rule runs at optimizer.lr x lr_scale, as a server's does
        self.rule = make_rule(optimizer)
        self.slots = {name: self.rule.init_slots(v.shape) for name, v in values.items()}
        self.updates = 0

    def set_lr_scale(self, scale: float) -> None:
        """Every trainer, at the same step: updates from the next one on run at the base rate x
        ``scale`` (Trainer.scale_learning_rate), so the replicas stay equal."""
        self.rule = make_rule(scaled(self.optimizer, check_lr_scale(scale, "the dense optimizer")))
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
            self.rule.apply(out[name], grad, self.slots[name], self.updates)
