"""Hybrid mode: dense parameters by allreduce (as in collective mode), sparse tables
on servers that keep sync steps. A step sends the tables' gradients to the servers
and applies the averaged dense gradients to this replica while that push is in
flight (``StepClient.push(..., while_waiting=)``)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from paramshard.collective import group
from paramshard.collective.replicas import join_replicas
from paramshard.env import ClusterEnv
from paramshard.trainer.backends.servers import ServerBackend, log


class HybridBackend(ServerBackend):
    data_parallel = None
    _dense_sync = None

    @classmethod
    def connect(cls, env: ClusterEnv, model, params, optimizer, find_unused_parameters: bool,
                max_in_flight: int, **_) -> "HybridBackend":
        backend = super().connect(env, params, max_in_flight, on_servers=[])     # the servers hold tables only
        try:
            backend.data_parallel, backend._dense_sync = join_replicas(env, model, params, optimizer,
                                                                       find_unused_parameters)
        except BaseException:
            backend.links.close()
            raise
        return backend

    @property
    def dense_sync(self):
        return self._dense_sync

    def _log_registered(self, values, tables) -> None:
        log.info("%d parameters averaged by allreduce over %d trainers (%s mode), %d sparse tables on "
                 "%d servers", len(values), self.env.num_trainers, self.mode, len(tables), len(self.env.servers))

    def push(self, grads, sparse_grads, step, values) -> None:
        # Tables to the servers; the dense update runs meanwhile.
        self.steps.push({}, sparse_grads, step, {},
                        while_waiting=lambda: self.dense_sync.push_dense(grads, step, values))

    def scale_learning_rate(self, factor, dense, tables, step) -> None:
        # Dense: this replica's rule (every trainer at the same step); tables: on the servers.
        if dense:
            self.dense_sync.set_lr_scale(self.dense_sync.lr_scale * factor)
        self._scale_on_servers(factor, False, tables, step)

    def roll_back(self, *args, **kwargs):
        raise AssertionError("hybrid mode has no checkpoints to roll back to (trainer_config.py refuses them)")

    def explain_failure(self, exc, step):
        return group.explain(exc, self.trainer_id, self.env.num_trainers, step)

    def hang_up(self) -> None:
        try:
            super().hang_up()
        finally:
            if self.data_parallel is not None:
                self.data_parallel.restore()
                self.data_parallel = None
            group.leave()


if TYPE_CHECKING:   # `make typecheck` checks the contract: TrainerBackend (trainer/backends/base.py)
    from paramshard.trainer.backends.base import TrainerBackend
    _trainer_backend: type[TrainerBackend] = HybridBackend
