"""Collective mode: no servers. The model forwards through DDP, whose backward
averages the gradients over the trainers; every trainer applies them to its own
replica (collective/allreduce_sync.py), so the replicas stay equal. Barriers are
the gloo group's."""
from __future__ import annotations

from typing import TYPE_CHECKING

from paramshard.client.step import PipelineStats
from paramshard.collective import group
from paramshard.collective.replicas import join_replicas
from paramshard.env import ClusterEnv
from paramshard.errors import ConfigError
from paramshard.log import get_logger

log = get_logger("trainer")


class CollectiveBackend:
    links = plan = steps = sparse = None      # nothing on servers

    def __init__(self, env: ClusterEnv, data_parallel, dense_sync):
        self.env, self.mode, self.trainer_id = env, env.mode, env.trainer_id
        self.data_parallel, self.dense_sync = data_parallel, dense_sync
        self.stats = PipelineStats()

    @classmethod
    def connect(cls, env: ClusterEnv, model, params, optimizer, find_unused_parameters: bool, **_):
        return cls(env, *join_replicas(env, model, params, optimizer, find_unused_parameters))

    def start(self, values, optimizer, tables, ckpt, is_chief: bool) -> int:
        if is_chief:
            self.dense_sync.register_dense(values, optimizer)     # DDP broadcast them already
            log.info("%d parameters averaged by allreduce over %d trainers (%s mode), %d sparse tables on "
                     "%d servers", len(values), self.env.num_trainers, self.mode, len(tables), len(self.env.servers))
        return self.dense_sync.pull_dense(values, min_version=0)

    # -- versions: every replica holds every update of the steps before ------------
    def row_version(self, step: int) -> int:
        return step

    def step_of_version(self, version: int) -> int | None:
        return version

    def fresh_after(self, current_ids, fresh_rows: bool):
        return None

    # -- steps: the backward did the communication -----------------------------------
    def pull_dense(self, values, min_version: int) -> int:
        return self.dense_sync.pull_dense(values, min_version=min_version)

    def push(self, grads, sparse_grads, step, values) -> None:
        self.dense_sync.push_dense(grads, step, values)
        self.stats["steps"] += 1

    def staleness(self) -> int | None:
        return None

    def flush(self) -> None:
        """Nothing is ever in flight: each step's update is applied before it returns."""

    def forget_fetches(self) -> None:
        """No rows are fetched ahead: there are no tables."""

    def explain_failure(self, exc, step):
        return group.explain(exc, self.trainer_id, self.env.num_trainers, step)

    # -- coordination ----------------------------------------------------------------
    def barrier(self, name, count, timeout, resumed) -> None:
        group.barrier(self.trainer_id, self.env.timeout * 10 if timeout is None else timeout)

    def broadcast(self, name, count, value, timeout, resumed):
        return group.broadcast_json(self.trainer_id, value, self.env.timeout * 10 if timeout is None else timeout)

    def scale_learning_rate(self, factor, dense, tables, step) -> None:
        # Every trainer changes its own replica's rule at the same step: the replicas stay equal.
        if dense:
            self.dense_sync.set_lr_scale(self.dense_sync.lr_scale * factor)

    def server_stats(self) -> list[dict]:
        return []

    # -- what needs servers: unreachable, the configuration was refused before (trainer_config.py)
    def _no_servers(self, *args, **kwargs):
        raise ConfigError(f"{self.mode} mode has no parameter servers: no tables, checkpoints or rollbacks")

    rows = row_source = prefetch = unused_in_a_row = save = save_own = roll_back = export_table = import_table = \
        _no_servers

    # -- end ---------------------------------------------------------------------------
    def leave(self, timeout: float) -> None:
        """The group has no membership to leave from: hang_up() destroys it."""

    def hang_up(self) -> None:
        """The model forwards by itself again; the trainers' group is left."""
        if self.data_parallel is not None:
            self.data_parallel.restore()
            self.data_parallel = None
        group.leave()


if TYPE_CHECKING:   # `make typecheck` checks the contract: TrainerBackend (trainer/backends/base.py)
    from paramshard.trainer.backends.base import TrainerBackend
    _trainer_backend: type[TrainerBackend] = CollectiveBackend
