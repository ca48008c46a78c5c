"""``DenseSync``: how a trainer keeps its dense parameters in step with the job's.

Two implementations, each held by the trainer backend of its modes (trainer/backends/):

- ``client.dense.DenseClient`` (sync and async modes): the parameters live on the
  servers, split into blocks; gradients are pushed there, the servers apply the
  update rule and send the new values back. (The Trainer sends that push together
  with its sparse tables' pushes, in one round: ``client/step.py``.)
- ``collective.allreduce_sync.AllreduceDenseSync`` (collective and hybrid modes): no
  server holds them; the gradients were averaged over the trainers by allreduce
  (DistributedDataParallel, in the backward) and every trainer applies the same
  update rule to its own replica.

Parameters are flat float32 numpy arrays by name (views of the torch tensors).
"""
from __future__ import annotations

from typing import Mapping, Protocol

import numpy as np

from paramshard.optim import OptimizerConfig


class DenseSync(Protocol):
    def register_dense(self, values: Mapping[str, np.ndarray], optimizer: OptimizerConfig,
                       timeout: float | None = None) -> None:
        """The chief's starting values and the update rule (called by the chief only)."""

    def pull_dense(self, out: Mapping[str, np.ndarray], min_version: int, timeout: float | None = None) -> int:
        """The job's current values (at least ``min_version`` updates) into ``out``; the
        number of updates they hold."""

    def push_dense(self, grads: Mapping[str, np.ndarray], step: int, out: Mapping[str, np.ndarray] | None = None,
                   timeout: float | None = None) -> None:
        """Step ``step``'s gradients; the updated values land in ``out``."""
