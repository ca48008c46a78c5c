"""Sync and async modes: dense blocks and sparse tables on the parameter servers.

One backend for both: how the servers apply a push (at a barrier, or as it comes)
is theirs; on this side the two differ only in what a version means (sync: a pull
at step k waits for every update of the steps before it) and in pushes left in
flight (async, ``max_in_flight``), which the StepClient handles.
"""
from __future__ import annotations

import torch
from typing import TYPE_CHECKING


from paramshard import runtime
from paramshard.client import checkpoint as checkpoint_io
from paramshard.client import control, recovery
from paramshard.client.dense import DenseClient
from paramshard.client.sparse import SparseClient
from paramshard.client.step import StepClient
from paramshard.env import ClusterEnv
from paramshard.errors import ConfigError
from paramshard.log import get_logger
from paramshard.mode import Mode
from paramshard.placement.partitions import Routing
from paramshard.placement.sharding import ParamSpec, make_plan
from paramshard.trainer.backends.row_source import RowSource

if TYPE_CHECKING:
    from paramshard.trainer.progress import TrainerProgress

log = get_logger("trainer")


def plan_for(env: ClusterEnv, on_servers: list[tuple[str, torch.nn.Parameter]]):
    """The placement of ``on_servers`` (name, parameter) in blocks over the job's servers."""
    return make_plan([ParamSpec(n, tuple(p.shape)) for n, p in on_servers], len(env.servers), env.dispatch,
                     env.min_block_size)


class ServerBackend:
    def __init__(self, env: ClusterEnv, links, plan, dense: DenseClient, sparse: SparseClient,
                 steps: StepClient):
        self.env, self.mode, self.trainer_id = env, env.mode, env.trainer_id
        self.links, self.plan = links, plan
        self.dense, self.sparse, self.steps = dense, sparse, steps
        self.stats = steps.stats
        self.joined_barrier_counts: dict[str, int] = {}    # a joiner's: where the job's counts were

    @classmethod
    def connect(cls, env: ClusterEnv, params, max_in_flight: int, on_servers=None, **_) -> "ServerBackend":
        """Links to the job's servers and the clients over them. ``on_servers``: the dense
        parameters the servers hold (default ``params``: all of them)."""
        plan = plan_for(env, params if on_servers is None else on_servers)
        links = runtime.links_for(env)
        dense = DenseClient(links, plan, env.trainer_id)
        sparse = SparseClient(links, env.trainer_id, Routing.initial(env.partitions, env.servers))
        if sparse.routing.elastic:
            dense.follow(sparse)          # blocks may move between servers too (DESIGN 5f)
        steps = StepClient(links, dense, sparse, max_in_flight)
        steps.bounded = env.mode is Mode.ASYNC and env.max_staleness is not None
        return cls(env, links, plan, dense, sparse, steps)

    # -- start ----------------------------------------------------------------
    @property
    def dense_sync(self):
        """How the dense parameters follow the job's (paramshard/dense_sync.py)."""
        return self.dense

    def start(self, values, optimizer, tables, ckpt, is_chief: bool) -> int:
        if self.sparse.routing.elastic:          # servers may have been added or removed before this trainer came
            self.sparse.refresh_routing()
        if self.env.joining:
            # Started mid-job in an elastic job (a replacement, a scale-up): the job is registered
            # already; it joins from the next step boundary and pulls the values that step starts from.
            first = control.join(self.links, self.trainer_id, self.env.timeout,
                                 barrier_counts=self.joined_barrier_counts)
            log.info("trainer %d joined the job from step %d", self.trainer_id, first)
            self.dense_sync.pull_dense(values, min_version=self.row_version(first))
            return first
        if ckpt is not None and ckpt.manifest.get("mode") == Mode.GEO and not self.mode.local_rounds:
            raise ConfigError(f"{ckpt.path} was written in geo mode: its servers hold the merged values with "
                              f"SGD(lr=1.0) and each trainer its own optimizer state; resume it with --mode geo")
        if is_chief and ckpt is not None:
            checkpoint_io.restore_checkpoint(self.links, self.plan, optimizer, tables, ckpt,
                                             routing=self.sparse.routing)
            log.info("restored checkpoint %s (step %d) onto %d servers", ckpt.path, ckpt.step, self.plan.num_servers)
        elif is_chief:
            self.dense_sync.register_dense(values, optimizer)
            for spec in tables.values():
                self.sparse.register_sparse(spec)
            self._log_registered(values, tables)
        return self.dense_sync.pull_dense(values, min_version=0)

    def _log_registered(self, values, tables) -> None:
        log.info("registered %d parameters (%d blocks) and %d sparse tables with %d servers, "
                 "dense load ratio %.3f", len(values), len(self.plan.blocks), len(tables),
                 self.plan.num_servers, self.plan.load_ratio())

    # -- versions ---------------------------------------------------------------
    @property
    def _versions_are_steps(self) -> bool:
        return self.mode.server_mode is Mode.SYNC

    def row_version(self, step: int) -> int:
        return step if self._versions_are_steps else 0

    def step_of_version(self, version: int) -> int | None:
        return version if self._versions_are_steps else None

    def fresh_after(self, current_ids, fresh_rows: bool):
        # Async, fresh_rows: rows the current step will push are asked for after that push (never
        # staler than without prefetching); its ids are those of the batch prepared before this
        # one. Sync: the version already makes the server wait for the step to be complete.
        if self._versions_are_steps or not fresh_rows:
            return None
        return True if current_ids is None else current_ids

    # -- steps ------------------------------------------------------------------
    def pull_dense(self, values, min_version: int) -> int:
        return self.dense_sync.pull_dense(values, min_version=min_version)

    def rows(self, table, ids, dim, step, create):
        return self.steps.rows(table, ids, dim, self.row_version(step), create)

    def row_source(self, table: str, dim: int, progress: TrainerProgress) -> RowSource:
        return RowSource(self, table, dim, progress)

    def prefetch(self, table, ids, step, fresh_after) -> None:
        self.steps.prefetch(table, ids, self.row_version(step), fresh_after)

    def forget_fetches(self) -> None:
        self.steps.forget_fetches()

    def unused_in_a_row(self, table: str) -> int:
        return self.steps.unused_in_a_row(table)

    def push(self, grads, sparse_grads, step, values) -> None:
        self.steps.push(grads, sparse_grads, step, values)

    def staleness(self) -> int | None:
        return self.steps.last_staleness

    def flush(self) -> None:
        self.steps.flush()

    # -- coordination, checkpoints --------------------------------------------------
    def barrier(self, name, count, timeout, resumed) -> None:
        self.steps.flush()
        control.barrier(self.links, self.trainer_id, name, count, timeout, self.links.epoch, resumed=resumed)

    def broadcast(self, name, count, value, timeout, resumed):
        self.steps.flush()
        sent = value if self.trainer_id == 0 else control.NO_VALUE
        return control.barrier(self.links, self.trainer_id, name, count, timeout, self.links.epoch, resumed=resumed,
                               broadcast=True, value=sent)

    def scale_learning_rate(self, factor, dense, tables, step) -> None:
        self._scale_on_servers(factor, dense, tables, step)

    def _scale_on_servers(self, factor, dense, tables, step) -> None:
        # The chief tells the servers; in sync mode they change it once they completed the
        # steps before ``step`` (server/services/learning_rates.py). The others have nothing to send.
        if self.trainer_id != 0 or not (dense or tables):
            return
        self.steps.flush()
        self.follow_routing()
        control.scale_learning_rate(self.links, self.trainer_id, factor, dense, tables,
                                    min_version=step if self._versions_are_steps else None, epoch=self.links.epoch)

    def save(self, tables, directory, step, settings, keep):
        if self.sparse.routing.elastic:      # a server added since this trainer last looked holds rows too
            self.sparse.refresh_routing()
        return checkpoint_io.save_checkpoint(self.links, self.plan, tables, directory, step, settings, keep=keep)

    def save_own(self, directory, step) -> None:
        pass            # the servers hold everything of this mode's

    def roll_back(self, values, optimizer, tables, checkpoint_dir, is_chief, timeout):
        self.steps.drop()      # what was in flight belongs to the epoch that is rolled back
        if self.sparse.routing.elastic:      # rows go back to the servers that own them now
            self.sparse.refresh_routing()
        ckpt = recovery.roll_back(self.links, self.plan, optimizer, tables, checkpoint_dir, is_chief,
                                  self.trainer_id, timeout, routing=self.sparse.routing)
        return ckpt, self.dense.pull_dense(values, min_version=0)

    def explain_failure(self, exc, step):
        return None

    def follow_routing(self) -> None:
        # Before asking every server: one a scale removed (and stopped) is skipped only once the
        # trainer has the routing naming it retired (no refusal may have brought it).
        if self.sparse is not None and self.sparse.routing.elastic:
            self.sparse.refresh_routing()

    def server_stats(self) -> list[dict]:
        self.follow_routing()
        return control.server_stats(self.links)

    def export_table(self, name):
        return self.sparse.export_sparse(name, with_meta=True)

    def import_table(self, name, ids, values) -> None:
        self.sparse.import_sparse(name, ids, values)

    # -- end --------------------------------------------------------------------------
    def leave(self, timeout: float) -> None:
        self.follow_routing()
        control.leave(self.links, self.trainer_id, timeout)

    def hang_up(self) -> None:
        self.links.close()


if TYPE_CHECKING:   # `make typecheck` checks the contract: TrainerBackend (trainer/backends/base.py)
    from paramshard.trainer.backends.base import TrainerBackend
    _trainer_backend: type[TrainerBackend] = ServerBackend
