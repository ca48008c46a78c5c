"""What a Trainer of collective or hybrid mode sets up: the trainers' group, the
model's forward through DDP, and the DenseSync that updates this replica.

The configuration (no checkpoints in these modes yet, no tables without servers)
was validated before this joins anything (trainer/trainer_config.py)."""
from __future__ import annotations

import torch

from paramshard.env import ClusterEnv
from paramshard.optim import OptimizerConfig
from paramshard.collective import group
from paramshard.collective.allreduce_sync import AllreduceDenseSync
from paramshard.collective.data_parallel import DataParallelForward


def join_replicas(env: ClusterEnv, model: torch.nn.Module, params: list[tuple[str, torch.nn.Parameter]],
                  optimizer: OptimizerConfig, find_unused_parameters: bool
                  ) -> tuple[DataParallelForward | None, AllreduceDenseSync]:
    """Join the trainers' group and replicate the model (every trainer builds its
    DDP together: the chief's values are broadcast then). ``params``: the dense
    parameters the Trainer trains, by name."""
    group.join(env)
    try:
        # DDP refuses a model without a trainable parameter (hybrid: a model of tables only).
        forward = DataParallelForward(model, find_unused_parameters) if params else None
    except BaseException:
        group.leave()
        raise
    return forward, AllreduceDenseSync(optimizer, {n: p.detach().view(-1).numpy() for n, p in params},
                                       tables=tables_with_own_optimizer(model, {n for n, _ in params}))


def tables_with_own_optimizer(model: torch.nn.Module, trained: set[str]) -> dict:
    """Parameter name -> (optimizer, row width) of the tables that declare their own
    optimizer (HashedEmbeddingBag(optimizer=...)): AllreduceDenseSync trains their rows with it."""
    tables = {}
    for name, module in model.named_modules():
        config = getattr(module, "row_optimizer", None)
        weight = f"{name}.weight" if name else "weight"
        if config is not None and weight in trained:
            tables[weight] = (config, module.embedding_dim)
    return tables
