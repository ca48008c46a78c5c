"""Train an nn.Module through the parameter servers.

The chief (trainer 0) registers the model's dense parameters, the optimizer
and every SparseEmbedding table with the servers; every trainer then pulls
the dense values, so all start from the same point. ``step(loss)`` runs
backward, pushes dense gradients and sparse row gradients together, and
receives the updated dense parameters in the same round trip.

In collective and hybrid modes (paramshard.collective) the dense parameters are
not on the servers: the model forwards through DistributedDataParallel, whose
backward averages the gradients over the trainers, and ``step`` applies them to
this trainer's replica (a DenseSync: paramshard/dense_sync.py); hybrid mode
still pushes the sparse tables' rows to the servers, in sync steps.

Checkpoints (``save``, ``resume=``) go through paramshard.client.checkpoint;
after a server died and was restarted in place, the Trainer rolls back with
the others (paramshard.client.recovery) and ``step_count`` goes back to the
checkpoint's step.
"""
from __future__ import annotations

import atexit
import functools
import weakref

import numpy as np
import torch

from .. import runtime
from ..checkpoint.format import write_trainer_position
from ..client import checkpoint as checkpoint_io
from ..client import control, recovery
from ..client.dense import DenseClient
from ..client.sparse import SparseClient
from ..client.step import PipelineStats, StepClient
from ..dense_sync import DenseSync
from ..env import ClusterEnv
from ..errors import ConfigError, ParamshardError
from ..log import get_logger
from ..observe.trainer_watch import TrainerWatch
from ..optim import OptimizerConfig
from ..sharding import ParamSpec, make_plan
from .loop import LoopPosition
from .optimizer_config import optimizer_config
from .position import capture, restore_random_streams
from .prefetch import prefetching
from .sparse_embedding import SparseEmbedding, tables_of
from .open_trainers import EXIT_CLOSE_TIMEOUT, _close_at_exit, current_trainer, remember  # noqa: F401

log = get_logger("trainer")

class Trainer:
    watch = metrics = None    # its records and /metrics exporter (observe/trainer_watch.py)
    data_parallel = None      # collective and hybrid modes: the model's forward through DDP

    def __init__(self, model: torch.nn.Module, optimizer: OptimizerConfig | None = None,
                 env: ClusterEnv | None = None, resume=None, max_in_flight: int | None = None,
                 find_unused_parameters: bool = False):
        """``resume``: a checkpoint to start from (default: PARAMSHARD_RESUME, set by
        ``paramshard launch --resume``); a step-N directory or a checkpoint directory.
        ``max_in_flight`` (async mode): pushes that may be unanswered when ``step`` returns,
        so the next forward overlaps the servers' update (default PARAMSHARD_MAX_IN_FLIGHT,
        else 1); a forward sees dense values at most that many of its own steps old. Sync
        mode waits for every step's barrier: 0. ``find_unused_parameters`` (collective and
        hybrid modes): passed to DistributedDataParallel, for models whose forward leaves
        some parameters out of the loss."""
        self.optimizer = optimizer_config(optimizer)     # before anything touches the network
        self.env = env or runtime.current()
        self.max_in_flight = self._window(max_in_flight)
        self.resume_from = str(resume) if resume is not None else self.env.resume
        self.position: dict = {}     # what the checkpoint resumed from says of this trainer ({} for a new job)
        self._saved_step: int | None = None
        self._recoveries = 0
        self._void_step = False
        self.loop = LoopPosition()      # where epochs()/prefetching() are in the data (torch/loop.py)
        # A rollback outside the batch loop (in a barrier, an evaluation): the barriers until the
        # loop replays the epoch's batches are skipped (the other trainers replay them too).
        self.replay_pending = False
        self._barrier_counts: dict[str, int] = {}
        self._resumed_barriers: set[str] = set()   # counts from a checkpoint, not yet passed here
        if self.env.role != "trainer":
            raise ConfigError(f"Trainer needs a trainer process, this one is {self.env.rank_name}")
        self.model = model
        self.trainer_id = self.env.trainer_id
        self.is_chief = self.trainer_id == 0
        self.step_count = 0
        self._params = self._dense_parameters(model)
        # Dense blocks on the servers in sync and async modes only; hybrid's servers hold tables.
        on_servers = [] if self.env.collective else self._params
        self.plan = make_plan([ParamSpec(n, tuple(p.shape)) for n, p in on_servers], len(self.env.servers),
                              self.env.dispatch, self.env.min_block_size) if self.env.servers else None
        self._closed = False
        self.links = runtime.links_for(self.env) if self.env.servers else None
        try:
            self.watch = TrainerWatch(self.env, model)
            self.metrics = self.watch.metrics
            if self.env.collective:
                from ..collective.replicas import join_replicas
                self.data_parallel, self.dense_sync = join_replicas(
                    self.env, model, self._params, self.optimizer, find_unused_parameters, self.resume_from)
            self._connect(model)
        except BaseException:
            self._hang_up()       # a failed start must not leave sockets (and their monitors) behind
            raise
        # A script that ends without close() still leaves (instead of looking dead to the servers).
        self._exit_hook = functools.partial(_close_at_exit, weakref.ref(self))
        atexit.register(self._exit_hook)
        remember(self)

    def _window(self, max_in_flight: int | None) -> int:
        chosen = max_in_flight if max_in_flight is not None else self.env.max_in_flight
        if self.env.mode != "async":
            if chosen:
                raise ConfigError(f"max_in_flight={chosen}: {self.env.mode} mode waits for every step (the "
                                  f"next forward needs every trainer's update); pushes in flight are for "
                                  f"PARAMSHARD_MODE=async")
            return 0
        chosen = 1 if chosen is None else chosen
        if not isinstance(chosen, int) or chosen < 0:
            raise ConfigError(f"max_in_flight must be a whole number >= 0, got {chosen!r}")
        bound = self.env.max_staleness
        if bound is not None and chosen > bound:
            # A push in flight is a step started before the servers said it may start.
            log.info("max_in_flight %d lowered to %d: --max-staleness %d", chosen, bound, bound)
            return bound
        return chosen

    def _connect(self, model: torch.nn.Module) -> None:
        self.tables = self._sparse_tables(model)
        self.stats = PipelineStats()
        self.dense = self.sparse = self.steps = None
        if self.links is None:        # collective mode: nothing on servers
            if self.tables:
                raise ConfigError(f"the model has SparseEmbedding tables {sorted(self.tables)}, and collective mode "
                                  f"has no servers to hold them: use --mode hybrid (dense parameters by allreduce, "
                                  f"tables on servers), or torch.nn.EmbeddingBag for a table every trainer holds")
        else:
            self.dense = DenseClient(self.links, self.plan, self.trainer_id)
            self.sparse = SparseClient(self.links, self.trainer_id)
            self.steps = StepClient(self.links, self.dense, self.sparse, self.max_in_flight)
            self.steps.bounded = self.env.mode == "async" and self.env.max_staleness is not None
            self.stats = self.steps.stats
        if not self.env.collective:
            self.dense_sync: DenseSync = self.dense
        # Flat numpy views sharing memory with the parameters: pulls land in place.
        self._values = {n: p.detach().view(-1).numpy() for n, p in self._params}
        ckpt = checkpoint_io.open_for_resume(self.resume_from, self.is_chief) if self.resume_from else None
        if self.is_chief and ckpt is not None:
            checkpoint_io.restore_checkpoint(self.links, self.plan, self.optimizer,
                                             {t.name: t.spec for t in self.tables.values()}, ckpt)
            log.info("restored checkpoint %s (step %d) onto %d servers", ckpt.path, ckpt.step, self.plan.num_servers)
        elif self.is_chief:
            self.dense_sync.register_dense(self._values, self.optimizer)
            for table in self.tables.values():
                self.sparse.register_sparse(table.spec)
            if self.env.collective:
                log.info("%d parameters averaged by allreduce over %d trainers (%s mode), %d sparse tables on "
                         "%d servers", len(self._params), self.env.num_trainers, self.env.mode, len(self.tables),
                         len(self.env.servers))
            else:
                log.info("registered %d parameters (%d blocks) and %d sparse tables with %d servers, "
                         "dense load ratio %.3f", len(self._params), len(self.plan.blocks), len(self.tables),
                         self.plan.num_servers, self.plan.load_ratio())
        version = self.dense_sync.pull_dense(self._values, min_version=0)
        if self.resume_from:
            self._resume_position(ckpt, version)
        for table in self.tables.values():
            table.attach(functools.partial(self._pull_rows, table))

    def _resume_position(self, ckpt, version: int) -> None:
        """Step count and random streams as they were at the checkpoint."""
        if ckpt is not None:
            self.step_count = ckpt.step
            self.position = ckpt.trainer_position(self.trainer_id) or {}
        elif self.env.server_mode == "sync":      # the checkpoint is not on this host: the servers know the step
            self.step_count = version
        if self.position.get("loop"):
            self.loop.load(self.position["loop"], self.step_count)
            self._barrier_counts = dict(self.loop.barrier_counts)
        elif self.loop.active:
            # No position file here (another host): the rollback stays in this epoch (epochs()
            # saves at every epoch's start), whose barrier counts are known.
            self._barrier_counts = dict(self.loop.barrier_counts)
        self._resumed_barriers = set(self._barrier_counts)
        restore_random_streams(self.position)
        self._saved_step = self.step_count
        log.info("trainer %d resumes at step %d%s", self.trainer_id, self.step_count,
                 "" if self.position else " (no saved position for this trainer: data and random streams "
                                          "start afresh)")

    @staticmethod
    def _sparse_tables(model: torch.nn.Module) -> dict[str, SparseEmbedding]:
        return tables_of(model)

    def _row_version(self, step: int) -> int:
        # Sync: rows must include every update of the steps before this one.
        return step if self.env.server_mode == "sync" else 0

    def _pull_rows(self, table: SparseEmbedding, ids: np.ndarray, create: bool = True) -> np.ndarray:
        try:
            return self.steps.rows(table.name, ids, table.dim, self._row_version(self.step_count), create)
        except ParamshardError as exc:
            self._recover(exc)
            # This forward's batch belongs to a step that was rolled back: its step() is void.
            self._void_step = True
            return self.steps.rows(table.name, ids, table.dim, self._row_version(self.step_count), create)

    def prefetch_rows(self, table: SparseEmbedding, ids, fresh_rows: bool = True) -> None:
        """Start pulling the rows of a coming batch's ``ids`` for ``table`` (the batch after
        the one being trained: its step is the next one)."""
        # Async, fresh_rows: rows the current step will push are asked for after that push (never
        # staler than without prefetching); its ids are those of the batch prepared before this
        # one. Sync: the version already makes the server wait for the step to be complete.
        current = table.prepared_ids()
        if self.env.server_mode == "sync" or not fresh_rows:
            fresh_after = None
        else:
            fresh_after = True if current is None else current
        self.steps.prefetch(table.name, table.prepare(ids), self._row_version(self.step_count + 1), fresh_after)

    def epochs(self, count: int):
        """The epochs to train, 1 to ``count``, from where this job is: ``for epoch in
        trainer.epochs(n): for batch in trainer.prefetching(loader): ...`` is exact through a
        rollback (``--max-restarts``), ``--resume`` and a whole-job restart: every batch is trained
        once, in order, whatever failed (torch/loop.py). With checkpoints on, each epoch starts
        with one. A rollback in the code after an epoch's batch loop (a barrier, an evaluation)
        runs that epoch again from the checkpoint's batch, so that code runs again too."""
        if type(count) is not int or count < 0:
            raise ConfigError(f"epochs({count!r}): expected a whole number of epochs >= 0")
        epoch = self.loop.epoch if self.loop.epoch is not None else 1
        resumed = self.loop.epoch is not None
        while epoch <= count:
            if not resumed:
                self.loop.begin_epoch(epoch, self.step_count, self._barrier_counts)
                if self.env.checkpoint_dir and not self.env.collective and self._saved_step != self.step_count:
                    try:
                        self.save()      # a rollback never goes back past the start of the epoch
                    except ParamshardError as exc:
                        self._recover(exc)           # back into the epoch before: go on there
                        epoch, resumed = self.loop.epoch or epoch, True
                        continue
            yield epoch
            # Rolled back after the batch loop: this epoch again, from the checkpoint's batch.
            resumed = self.replay_pending
            if not resumed:
                epoch += 1
        self.loop.begin_epoch(epoch, self.step_count, self._barrier_counts)   # a resume goes on from here

    @property
    def recoveries(self) -> int:
        """Rollbacks so far (``launch --max-restarts``)."""
        return self._recoveries

    def barrier_counts(self) -> dict[str, int]:
        return dict(self._barrier_counts)

    def replay_starts(self) -> None:
        """The batch loop goes on from the rolled-back position: what was void is over."""
        self.replay_pending = False
        self._void_step = False

    def prefetching(self, iterable, ids=None, fresh_rows: bool = True, convert=None):
        """Iterate ``iterable`` (a data loader) and fetch each next batch's rows while the
        current one trains: ``for batch in trainer.prefetching(loader): ...``. After a rollback
        it goes on from the checkpoint's batch, and in ``epochs()`` from the resumed epoch's
        batch (torch/loop.py); ``convert``: a function applied to each batch (e.g.
        ``TabularBatch.torch``), keeping the loader's position. Which tensor
        feeds which table is found after the first batch; ``ids``: a function batch -> ids
        tensor (every table) or -> {table name: tensor}, when the model computes its ids.
        Sync results are unchanged. Async: rows are never staler than without prefetching
        (the rows of ids the current step pushes are fetched right after that push);
        ``fresh_rows=False`` fetches them ahead too, for more overlap, and they then miss
        this trainer's update of the step just before (benchmarks/RESULTS.md measures both)."""
        return prefetching(self, iterable, ids, fresh_rows, convert)

    def pipeline_stats(self) -> dict:
        """How the steps overlapped: prefetch hits/misses, seconds spent waiting for rows
        and for push replies, the most pushes left in flight."""
        return {**self.stats.as_dict(), "max_in_flight": self.max_in_flight}

    def _recover(self, exc: ParamshardError) -> None:
        """A server died and the launcher restarts it in place: roll back to the latest
        checkpoint with every other trainer (client/recovery.py). Re-raises ``exc`` when
        recovery is off or spent."""
        if not (self.env.max_restarts and self.env.checkpoint_dir and recovery.recoverable(exc)) or self.env.collective \
                or self._recoveries >= self.env.max_restarts:
            raise exc
        self._recoveries += 1
        failed_at = self.step_count
        log.warning("trainer %d: %s; waiting for the servers, then rolling back to the latest checkpoint "
                    "(recovery %d of %d)", self.trainer_id, exc, self._recoveries, self.env.max_restarts)
        self.steps.drop()      # what was in flight belongs to the epoch that is rolled back
        self.replay_pending = self.loop.active   # the batch loop replays; barriers until then are void
        ckpt = recovery.roll_back(self.links, self.plan, self.optimizer, {t.name: t.spec for t in self.tables.values()},
                                  self.env.checkpoint_dir, self.is_chief, self.trainer_id, self.env.timeout)
        version = self.dense.pull_dense(self._values, min_version=0)
        self.position = {}
        self._resume_position(ckpt, version)
        self._saved_step = self.step_count
        for _, p in self._params:
            p.grad = None
        for table in self.tables.values():
            table.take_gradients()
        log.warning("trainer %d: rolled back from step %d to checkpoint step %d: %s", self.trainer_id, failed_at,
                    self.step_count, self._replay_plan(failed_at))

    def _replay_plan(self, failed_at: int) -> str:
        """What the rollback makes the script train again, in its own words."""
        lost = failed_at - self.step_count
        if self.loop.active:
            where = f"epoch {self.loop.epoch}, " if self.loop.epoch is not None else ""
            batch = self.step_count - (self.loop.start_step or 0)
            return (f"{lost} steps are trained again: the batch loop goes on from {where}batch {batch} "
                    f"(trainer.prefetching replays them)")
        return (f"{lost} steps are trained again if the script's loop follows trainer.step_count; a plain "
                f"'for batch in loader' loop does not replay them (use trainer.epochs() and "
                f"trainer.prefetching(loader))")

    @staticmethod
    def _dense_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
        params = []
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            if p.dtype != torch.float32 or p.device.type != "cpu" or not p.is_contiguous():
                raise ConfigError(f"parameter {name}: paramshard serves contiguous float32 CPU "
                                  f"tensors, this one is {p.dtype} on {p.device}")
            params.append((name, p))
        return params

    def step(self, loss: torch.Tensor | None = None) -> None:
        """Backward (if ``loss`` is given), push gradients, take the new values. After a
        recovery (``launch --max-restarts``) ``step_count`` went back to the checkpoint's
        step: a loop driven by ``step_count`` trains those steps again."""
        if self._closed:
            raise ConfigError("Trainer.step after close()")
        if self._void_step:     # its forward ran before a rollback: nothing of it counts
            self._void_step = False
            for _, p in self._params:
                p.grad = None
            for table in self.tables.values():
                table.take_gradients()
            return
        try:
            self._step(loss)
        except ParamshardError as exc:
            self._recover(exc)
            return
        if self.watch is not None:
            self.watch.after_step(self.step_count, loss, self.stats, self.steps and self.steps.last_staleness)

    def log(self, **values) -> None:
        """Report values with this trainer's progress (the launcher's live table, the run
        directory, /metrics): ``loss=``, ``epoch=``, ``total_steps=`` (for an ETA),
        ``samples=`` (this step's, when the model's first input does not say), and any
        metric of your own (``auc=0.78``)."""
        self.watch.log(**values)

    def _step(self, loss: torch.Tensor | None) -> None:
        if loss is not None:
            try:
                loss.backward()          # collective, hybrid: DDP's allreduce runs in here
            except RuntimeError as exc:
                self._explain_collective_failure(exc)
                raise
        grads = {}
        for name, p in self._params:
            # A parameter the loss did not touch still takes part in the step
            # (sync servers wait for every trainer): its gradient is zero.
            grads[name] = (p.grad.detach().contiguous().view(-1).numpy() if p.grad is not None
                           else np.zeros(p.numel(), np.float32))
        sparse_grads = [(table.name, *table.take_gradients()) for table in self.tables.values()]
        step = self.step_count
        if self.steps is None:          # collective: the backward averaged the gradients
            self.dense_sync.push_dense(grads, step, self._values)
            self.stats["steps"] += 1
        elif self.env.collective:       # hybrid: tables to the servers; the dense update runs meanwhile
            self.steps.push({}, sparse_grads, step, {},
                            while_waiting=lambda: self.dense_sync.push_dense(grads, step, self._values))
        else:
            self.steps.push(grads, sparse_grads, step, self._values)
        self.step_count += 1
        for _, p in self._params:
            p.grad = None
        every = self.env.checkpoint_every
        if every and self.env.checkpoint_dir and self.step_count % every == 0:
            self.save()

    def _explain_collective_failure(self, exc: RuntimeError) -> None:
        """Raise an error naming the trainers a failed allreduce waited for (if it is that)."""
        if self.env.collective:
            from ..collective import group
            named = group.explain(exc, self.trainer_id, self.env.num_trainers, self.step_count)
            if named is not None:
                raise named from None

    def save(self, directory=None, state: dict | None = None) -> None:
        """A checkpoint of the whole job at this step: every trainer calls it at the same step
        (sync mode); the chief saves what the servers hold, each trainer its own position
        (``state``: anything JSON the script needs to find its place in the data again)."""
        directory = directory or self.env.checkpoint_dir
        if self.env.collective:
            raise ConfigError(f"Trainer.save(): checkpoints are not available in {self.env.mode} mode yet")
        if directory is None:
            raise ConfigError("Trainer.save() needs a directory (or PARAMSHARD_CHECKPOINT_DIR: "
                              "paramshard launch --checkpoint-dir DIR)")
        self.steps.flush()       # every step up to this one is on the servers
        if self.is_chief:
            settings = {"mode": self.env.mode, "trainers": self.env.num_trainers, "job_id": self.env.job_id}
            path, nbytes, seconds = checkpoint_io.save_checkpoint(
                self.links, self.plan, {t.name: t.spec for t in self.tables.values()}, directory, self.step_count,
                settings, keep=self.env.checkpoint_keep)
            log.info("checkpoint %s: %.1f MB in %.2f s (%.0f MB/s)", path, nbytes / 1e6, seconds,
                     nbytes / 1e6 / max(seconds, 1e-9))
        position = capture(self.step_count, state)
        loop = self.loop.as_json(self.step_count, self._barrier_counts)
        if loop is not None:
            position["loop"] = loop
        write_trainer_position(directory, self.step_count, self.trainer_id, position)
        self._saved_step = self.step_count

    def pull(self) -> None:
        """Fetch the current parameter values (e.g. before evaluating in async mode)."""
        if self.steps is not None:
            self.steps.flush()
        self.dense_sync.pull_dense(self._values, min_version=self._row_version(self.step_count))

    def export_table(self, name: str, path) -> int:
        """Write every server's rows of table ``name`` into one file (see paramshard.export)."""
        from ..export import save_table
        self._table(name)
        self.steps.flush()      # a table exists only with servers: steps too
        ids, values, meta = self.sparse.export_sparse(name, with_meta=True)
        save_table(path, meta, ids, values)
        return len(ids)

    def import_table(self, name: str, path) -> int:
        """Load rows exported by an earlier job into table ``name`` (chief only, before training)."""
        from ..export import load_table
        table = self._table(name)
        exported = load_table(path)
        if exported.dim != table.dim:
            raise ConfigError(f"{path}: rows of dim {exported.dim}, table {name!r} has dim {table.dim}")
        self.sparse.import_sparse(name, exported.ids, exported.values)
        return len(exported.ids)

    def _table(self, name: str) -> SparseEmbedding:
        if name not in self.tables:
            raise ConfigError(f"no SparseEmbedding named {name!r} in this model; tables: {sorted(self.tables)}")
        return self.tables[name]

    def barrier(self, name: str = "default", timeout: float | None = None) -> None:
        """Return once every trainer that has not left called ``barrier(name)`` as often as this
        one (this trainer's pushes are on the servers first). ``timeout``: None waits up to
        10 x PARAMSHARD_TIMEOUT, math.inf as long as those waited for are alive; a trainer
        that died fails it at once. See paramshard.client.control.barrier."""
        if self._closed:
            raise ConfigError("Trainer.barrier after close()")
        if self.replay_pending:
            return      # rolled back: the batch loop replays first, and every trainer skips to there
        count = self._barrier_counts.get(name, 0) + 1
        if self.steps is None:      # collective: no servers, the trainers' group
            from ..collective import group
            group.barrier(self.trainer_id, self.env.timeout * 10 if timeout is None else timeout)
        else:
            try:
                self.steps.flush()
                control.barrier(self.links, self.trainer_id, name, count, timeout, self.links.epoch,
                                resumed=name in self._resumed_barriers)
            except ParamshardError as exc:
                self._recover(exc)
                self.replay_pending = True
                return
        self._barrier_counts[name] = count     # only once passed: a failed wait is retried with its count
        self._resumed_barriers.discard(name)

    def server_stats(self) -> list[dict]:
        return control.server_stats(self.links) if self.links is not None else []

    def close(self, timeout: float = 10, leave: bool = True) -> None:
        """Tell every server this trainer is done (sync barriers stop waiting for it).
        ``leave=False`` only hangs up: the servers count this trainer as lost, as they
        should when it stops because something went wrong."""
        if self._closed:
            return
        self._closed = True
        hook = getattr(self, "_exit_hook", None)
        if hook is not None:
            atexit.unregister(hook)
        try:
            if leave and self.steps is not None:
                self.steps.flush()    # the last pushes count: they reach the servers before the leave
            if leave and self.env.checkpoint_dir and self._saved_step != self.step_count:
                self.save()      # the final checkpoint: the last one always holds the trained model
            if leave and self.links is not None:
                control.leave(self.links, self.trainer_id, timeout)
        finally:
            self._hang_up()

    def _hang_up(self) -> None:
        """Close sockets, the watch and the trainers' group; the model forwards by itself again."""
        if self.links is not None:
            self.links.close()
        if self.watch is not None:
            self.watch.close()
        if self.data_parallel is not None:
            self.data_parallel.restore()
            self.data_parallel = None
        if self.env.collective:
            from ..collective import group
            group.leave()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        # Leaving on an exception would let a sync job carry on without this trainer's
        # batches, as if it had finished: hang up instead, so the others stop too.
        self.close(leave=exc_type is None)
