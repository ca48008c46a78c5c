"""Everything a Trainer refuses, checked before it touches anything.

``validate`` runs before the first socket, the trainers' group or a server is
touched, so a refused configuration leaves nothing behind (and is unit-tested
without any server: tests/unit/trainer/test_trainer_config.py). The mode answers what it
allows (paramshard/mode.py); the wording of each refusal is the one users know.
"""
from __future__ import annotations

import dataclasses

import torch

from paramshard.env import ClusterEnv
from paramshard.errors import ConfigError
from paramshard.log import get_logger
from paramshard.specs.model_spec import spec_of
from paramshard.trainer.sparse_embedding import SparseEmbedding, tables_of

log = get_logger("trainer")


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """What a Trainer was found to train, and how."""
    max_in_flight: int                                    # pushes left unanswered after step() (async)
    resume_from: str | None                               # the checkpoint to start from
    params: list[tuple[str, torch.nn.Parameter]]          # the dense parameters, by name
    tables: dict[str, SparseEmbedding]                    # the SparseEmbedding tables, by name


def validate(env: ClusterEnv, model: torch.nn.Module, max_in_flight: int | None = None,
             resume=None) -> TrainerConfig:
    """The Trainer's configuration, or the ConfigError of the first thing refused."""
    window = in_flight_window(env, max_in_flight)
    resume_from = str(resume) if resume is not None else env.resume
    if env.role != "trainer":
        raise ConfigError(f"Trainer needs a trainer process, this one is {env.rank_name}")
    params = dense_parameters(model)
    if not env.mode.checkpoints and (env.checkpoint_dir or resume_from):
        raise ConfigError(f"checkpoints are not available in {env.mode} mode yet (the dense replicas are on the "
                          f"trainers, not on servers): drop --checkpoint-dir/--resume, or use sync mode")
    spec_of(model)          # a paramshard_spec of the user's own is refused now, not at the first checkpoint
    tables = tables_of(model)
    if tables and not env.mode.has_servers:
        raise ConfigError(f"the model has SparseEmbedding tables {sorted(tables)}, and collective mode "
                          f"has no servers to hold them: use --mode hybrid (dense parameters by allreduce, "
                          f"tables on servers), or torch.nn.EmbeddingBag for a table every trainer holds")
    return TrainerConfig(window, resume_from, params, tables)


def in_flight_window(env: ClusterEnv, max_in_flight: int | None) -> int:
    """Pushes that may be unanswered when ``step`` returns: 0 unless the mode lets steps overlap."""
    chosen = max_in_flight if max_in_flight is not None else env.max_in_flight
    if env.mode.waits_every_step:
        if chosen:
            raise ConfigError(f"max_in_flight={chosen}: {env.mode} mode waits for every step (the "
                              f"next forward needs every trainer's update); pushes in flight are for "
                              f"PARAMSHARD_MODE=async")
        return 0
    chosen = 1 if chosen is None else chosen
    if not isinstance(chosen, int) or chosen < 0:
        raise ConfigError(f"max_in_flight must be a whole number >= 0, got {chosen!r}")
    bound = env.max_staleness
    if bound is not None and chosen > bound:
        # A push in flight is a step started before the servers said it may start.
        log.info("max_in_flight %d lowered to %d: --max-staleness %d", chosen, bound, bound)
        return bound
    return chosen


def dense_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The parameters the Trainer trains as dense ones (every one that requires a gradient)."""
    params = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.dtype != torch.float32 or p.device.type != "cpu" or not p.is_contiguous():
            raise ConfigError(f"parameter {name}: paramshard serves contiguous float32 CPU "
                              f"tensors, this one is {p.dtype} on {p.device}")
        params.append((name, p))
    return params


def check_save(env: ClusterEnv, directory) -> None:
    """``Trainer.save(directory)`` is possible in this mode, with this directory."""
    if not env.mode.checkpoints:
        raise ConfigError(f"Trainer.save(): checkpoints are not available in {env.mode} mode yet")
    if directory is None:
        raise ConfigError("Trainer.save() needs a directory (or PARAMSHARD_CHECKPOINT_DIR: "
                          "paramshard launch --checkpoint-dir DIR)")
