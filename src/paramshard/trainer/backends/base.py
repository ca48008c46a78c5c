"""``TrainerBackend``: what a Trainer needs from the job, whatever its mode.

The Trainer (trainer/trainer.py) speaks torch: parameters, gradients, the batch loop.
Where the values live and how a step reaches the others is the backend's: one
implementation per mode, chosen once from ``env.mode`` (``backends.open_backend``):

- ``servers.ServerBackend`` (sync, async): dense blocks and tables on the servers;
  a step is one push with the new dense values in its reply (client/step.py).
- ``collective.CollectiveBackend``: no servers; DDP's backward averaged the
  gradients, every trainer updates its own replica; barriers in the gloo group.
- ``hybrid.HybridBackend``: the tables' push goes to the servers and the dense
  update by allreduce runs while it is in flight.

Dense values are flat float32 numpy views of the parameters, by name (``values``);
a table's gradient is (name, ids, grads). Everything a mode answers differently
(which version a pull waits for, whether rows are fetched fresh after a push) is a
method here, so the Trainer never asks which mode it is in.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Protocol

import numpy as np

from paramshard.checkpoint.format import Checkpoint
from paramshard.client.sparse import SparseClient, TableSpec
from paramshard.client.step import PipelineStats, StepClient
from paramshard.mode import Mode
from paramshard.optim import OptimizerConfig
from paramshard.placement.sharding import ShardPlan
from paramshard.trainer.backends.row_source import RowSource

if TYPE_CHECKING:
    from paramshard.trainer.progress import TrainerProgress

Values = Mapping[str, np.ndarray]
SparseGrads = list[tuple[str, np.ndarray, np.ndarray]]


class TrainerBackend(Protocol):
    # Read-only to its users (properties, so a backend may narrow one: ServerBackend's
    # ``steps`` is a StepClient, CollectiveBackend's None).
    @property
    def mode(self) -> Mode: ...
    @property
    def links(self) -> object | None: ...          # ServerLinks / LocalLinks; None without servers
    @property
    def plan(self) -> ShardPlan | None: ...        # the dense blocks' placement; None without servers
    @property
    def steps(self) -> StepClient | None: ...      # the pipelined step client; None without servers
    @property
    def sparse(self) -> SparseClient | None: ...   # the tables' client; None without servers
    @property
    def stats(self) -> PipelineStats: ...          # prefetch hits, waits, steps (Trainer.pipeline_stats)

    # -- start ----------------------------------------------------------------
    def start(self, values: Values, optimizer: OptimizerConfig, tables: Mapping[str, TableSpec],
              ckpt: Checkpoint | None, is_chief: bool) -> int:
        """Chief: restore ``ckpt`` or register the starting values and tables; then
        everyone pulls the job's dense values into ``values``. Returns their version."""

    # -- versions: what a mode means by "fresh" --------------------------------
    def row_version(self, step: int) -> int:
        """The version a pull made at ``step`` waits for (sync: every earlier step)."""

    def step_of_version(self, version: int) -> int | None:
        """The step a resumed dense version stands for, when versions count steps."""

    def fresh_after(self, current_ids, fresh_rows: bool):
        """StepClient.prefetch's ``fresh_after`` for a batch prefetched while ``current_ids`` train."""

    # -- steps ----------------------------------------------------------------
    def pull_dense(self, values: Values, min_version: int) -> int:
        """The job's current dense values into ``values``."""

    def rows(self, table: str, ids: np.ndarray, dim: int, step: int, create: bool) -> np.ndarray:
        """Rows of ``ids`` for the forward of ``step``."""

    def row_source(self, table: str, dim: int, progress: TrainerProgress) -> RowSource:
        """What table ``table``'s forward reads its rows from, at ``progress``'s step
        (backends/row_source.py; the Trainer attaches it to the SparseEmbedding)."""

    def prefetch(self, table: str, ids: np.ndarray, step: int, fresh_after) -> None:
        """Start pulling the rows of the batch of ``step``."""

    def forget_fetches(self) -> None:
        """Rows fetched ahead are not wanted any more (the loop ended, a rollback)."""

    def unused_in_a_row(self, table: str) -> int:
        """Prefetches of ``table`` in a row that no forward took."""

    def push(self, grads: Values, sparse_grads: SparseGrads, step: int, values: Values) -> None:
        """Step ``step``'s gradients; the new dense values land in ``values`` (now or by a flush)."""

    def staleness(self) -> int | None:
        """What the servers said of the latest push taken (async), else None."""

    def flush(self) -> None:
        """Every push is answered and its values are in the parameters."""

    # -- coordination, checkpoints --------------------------------------------
    def barrier(self, name: str, count: int, timeout: float | None, resumed: bool) -> None:
        """Every trainer reached barrier ``name`` ``count`` times."""

    def broadcast(self, name: str, count: int, value, timeout: float | None, resumed: bool):
        """Barrier ``name`` #``count`` that hands every trainer trainer 0's ``value`` (returned)."""

    def scale_learning_rate(self, factor: float, dense: bool, tables: list[str], step: int) -> None:
        """Multiply the dense (``dense``) and ``tables``' learning rates by ``factor`` from step
        ``step`` on; every trainer calls it at the same step."""

    def save(self, tables: Mapping[str, TableSpec], directory, step: int, settings: Mapping,
             keep: int | None) -> tuple:
        """Chief: the servers' state as checkpoint ``step``: (path, bytes, seconds)."""

    def save_own(self, directory, step: int) -> None:
        """Every trainer, before its position file: what is this trainer's own in checkpoint ``step``
        (geo: its local optimizer's slots, geo/trainer_state.py); nothing in the other modes."""

    def roll_back(self, values: Values, optimizer: OptimizerConfig, tables: Mapping[str, TableSpec],
                  checkpoint_dir, is_chief: bool, timeout: float) -> tuple[Checkpoint | None, int]:
        """Every server back at the latest checkpoint, its dense values in ``values``:
        (the checkpoint if this trainer can read it, the dense version)."""

    def explain_failure(self, exc: BaseException, step: int) -> BaseException | None:
        """A clearer error for a backward that failed talking to the others, or None."""

    def server_stats(self) -> list[dict]: ...

    def export_table(self, name: str) -> tuple[np.ndarray, np.ndarray, dict]: ...

    def import_table(self, name: str, ids: np.ndarray, values: np.ndarray) -> None: ...

    # -- end ------------------------------------------------------------------
    def leave(self, timeout: float) -> None:
        """Tell the others this trainer is done (its pushes are flushed first)."""

    def hang_up(self) -> None:
        """Close what the backend holds (sockets, the trainers' group, the DDP forward)."""
