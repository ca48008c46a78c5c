"""What a Trainer of collective or hybrid mode sets up: the trainers' group, the
model's forward through DDP, and the DenseSync that updates this replica."""
from __future__ import annotations

import torch

from ..env import ClusterEnv
from ..errors import ConfigError
from ..optim import OptimizerConfig
from . import group
from .data_parallel import DataParallelForward
from .dense_sync import AllreduceDenseSync


def join_replicas(env: ClusterEnv, model: torch.nn.Module, params: list[tuple[str, torch.nn.Parameter]],
                  optimizer: OptimizerConfig, find_unused_parameters: bool, resume: str | None
                  ) -> tuple[DataParallelForward | None, AllreduceDenseSync]:
    """Join the trainers' group and replicate the model (every trainer builds its
    DDP together: the chief's values are broadcast then). ``params``: the dense
    parameters the Trainer trains, by name."""
    if env.checkpoint_dir or resume:
        raise ConfigError(f"checkpoints are not available in {env.mode} mode yet (the dense replicas are on the "
                          f"trainers, not on servers): drop --checkpoint-dir/--resume, or use sync mode")
    group.join(env)
    # DDP refuses a model without a trainable parameter (hybrid: a model of tables only).
    forward = DataParallelForward(model, find_unused_parameters) if params else None
    return forward, AllreduceDenseSync(optimizer, {n: p.detach().view(-1).numpy() for n, p in params})
