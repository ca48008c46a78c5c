"""Train an nn.Module with the job: ``step(loss)`` runs backward and sends the step.

The Trainer speaks torch (parameters, gradients, the batch loop, the script's calls);
where the values live is its backend's, one per mode, chosen once from ``env.mode``
(trainer/backends/): the servers hold dense blocks and tables (sync, async), the
trainers average dense gradients by allreduce (collective), or both (hybrid). Its
configuration is validated before anything is joined (trainer/trainer_config.py).

Checkpoints (``save``, ``resume=``) go through paramshard.client.checkpoint; after a
server died and was restarted in place, the Trainer rolls back with the others when
its RecoveryPolicy admits it (client/recovery.py) and ``step_count`` goes back to the
checkpoint's step. Where the trainer is (step, data position, ``state``, barrier counts,
resume and rollback) is its ``TrainerProgress``'s (trainer/progress.py): the modules
beside this one get that object, never this one's private attributes.
"""
from __future__ import annotations

import atexit
import functools
import weakref

import numpy as np
import torch

from paramshard import runtime
from paramshard.client import checkpoint as checkpoint_io
from paramshard.client.recovery import RecoveryPolicy
from paramshard.env import ClusterEnv
from paramshard.errors import ConfigError, ParamshardError
from paramshard.events import TrainerListeners
from paramshard.log import get_logger
from paramshard.optim import OptimizerConfig
from paramshard.trainer import checkpointing, decisions, leave_request, table_io, trainer_config
from paramshard.trainer.backends import open_backend
from paramshard.trainer.epochs import epochs
from paramshard.trainer.optimizer_config import optimizer_config
from paramshard.trainer.prefetch import prefetching
from paramshard.trainer.progress import TrainerProgress
from paramshard.trainer.sparse_embedding import SparseEmbedding
from paramshard.trainer.open_trainers import EXIT_CLOSE_TIMEOUT, _close_at_exit, remember  # noqa: F401

log = get_logger("trainer")


class Trainer:
    listeners = metrics = None    # who watches the steps (paramshard/events.py); its /metrics, if one has it
    links = plan = steps = sparse = None    # the backend's servers and clients (None without servers)
    _dense_parameters = staticmethod(trainer_config.dense_parameters)     # `paramshard plan` sizes a model with it

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
        config = trainer_config.validate(self.env, model, max_in_flight, resume)   # before joining anything
        self.max_in_flight, self.resume_from = config.max_in_flight, config.resume_from
        self.model, self._params, self.tables = model, config.params, config.tables
        self.trainer_id = self.env.trainer_id
        self.is_chief = self.trainer_id == 0
        # Step, data position, state, barrier counts, resume and rollback (trainer/progress.py).
        self.progress = TrainerProgress(self.trainer_id, RecoveryPolicy.for_env(self.env))
        self._closed = False
        # An elastic job's launcher may ask this trainer to leave (trainer/leave_request.py): the
        # batch loops end at the next step boundary.
        self.leave_requested = False
        if self.env.min_trainers is not None:
            leave_request.install(self)
        self.backend = open_backend(self.env, model, self._params, self.optimizer, self.max_in_flight,
                                    find_unused_parameters)
        b = self.backend
        self.links, self.plan, self.steps, self.sparse, self.stats = b.links, b.plan, b.steps, b.sparse, b.stats
        try:
            self.listeners = TrainerListeners(self.env, model)
            self.metrics = next((x.metrics for x in self.listeners.listeners if hasattr(x, "metrics")), None)
            self._start()
            self.listeners.started(self)
        except BaseException:
            self._hang_up()       # a failed start must not leave sockets (and their monitors) behind
            raise
        # A script that ends without close() still leaves (instead of looking dead to the servers).
        self._exit_hook = functools.partial(_close_at_exit, weakref.ref(self))
        atexit.register(self._exit_hook)
        remember(self)

    def _start(self) -> None:
        # Flat numpy views sharing memory with the parameters: pulls land in place.
        self._values = {n: p.detach().view(-1).numpy() for n, p in self._params}
        ckpt = checkpoint_io.open_for_resume(self.resume_from, self.is_chief) if self.resume_from else None
        version = self.backend.start(self._values, self.optimizer, self.table_specs(), ckpt, self.is_chief)
        if self.env.joining:
            # Joined mid-job: its first step is the servers' next one, its barriers at the job's counts.
            self.progress.joined_at(version, getattr(self.backend, "joined_barrier_counts", {}))
        self.progress.restore_with(_restore(self.backend, self._values, self.optimizer, self._params, self.tables,
                                            self.env, self.is_chief))
        if self.resume_from:
            self.progress.resume(ckpt, None if ckpt is not None else self.backend.step_of_version(version))
        for table in self.tables.values():
            # The backend's row source reads at this trainer's step: the forward calls down, not up here.
            table.attach(self.backend.row_source(table.name, table.dim, self.progress))

    def table_specs(self) -> dict:
        return {t.name: t.spec for t in self.tables.values()}

    def prefetch_rows(self, table: SparseEmbedding, ids, fresh_rows: bool = True) -> None:
        """Start pulling the rows of a coming batch's ``ids`` for ``table`` (the batch after
        the one being trained: its step is the next one)."""
        fresh_after = self.backend.fresh_after(table.prepared_ids(), fresh_rows)
        self.backend.prefetch(table.name, table.prepare(ids), self.progress.step + 1, fresh_after)

    # -- where the trainer is: its TrainerProgress's (the names scripts and the app read) --
    @property
    def step_count(self) -> int:
        return self.progress.step

    @step_count.setter
    def step_count(self, step: int) -> None:
        self.progress.step = step

    @property
    def state(self) -> dict:
        """Anything JSON the script keeps here is saved with every checkpoint of this trainer, the
        automatic ones too (epochs(), checkpoint_every, close), and is the checkpoint's again
        after a resume or a rollback: e.g. the CTR app's validation history and best epoch."""
        return self.progress.state

    @state.setter
    def state(self, value: dict) -> None:
        self.progress.state = value

    @property
    def position(self) -> dict:
        """What the checkpoint resumed from says of this trainer ({} for a new job)."""
        return self.progress.position

    @property
    def loop(self):
        """Where epochs()/prefetching() are in the data (trainer/loop.py)."""
        return self.progress.loop

    @property
    def replay_pending(self) -> bool:
        """Rolled back outside the batch loop: barriers are void until the loop replays."""
        return self.progress.replay_pending

    @property
    def recovery(self) -> RecoveryPolicy:
        return self.progress.recovery

    @property
    def closed(self) -> bool:
        """close() was called: the Trainer takes no more steps, barriers or decisions."""
        return self._closed

    def dense_values(self) -> dict[str, np.ndarray]:
        """A copy of every dense parameter this trainer holds, shaped, by name (``pull()`` first
        for the job's latest in async mode)."""
        return {name: self._values[name].reshape(p.shape).copy() for name, p in self._params}

    def epochs(self, count: int):
        """The epochs to train, 1 to ``count``, from where this job is: ``for epoch in
        trainer.epochs(n): for batch in trainer.prefetching(loader): ...`` is exact through a
        rollback (``--max-restarts``), ``--resume`` and a whole-job restart: every batch is trained
        once, in order, whatever failed (trainer/loop.py). With checkpoints on, each epoch starts
        with one. A rollback in the code after an epoch's batch loop (a barrier, an evaluation)
        runs that epoch again from the checkpoint's batch, so that code runs again too."""
        return epochs(self, count)

    @property
    def recoveries(self) -> int:
        """Rollbacks so far (``launch --max-restarts``)."""
        return self.progress.recoveries

    def barrier_counts(self) -> dict[str, int]:
        return self.progress.barrier_counts()

    def replay_starts(self) -> None:
        """The batch loop goes on from the rolled-back position: what was void is over."""
        self.progress.replay_starts()

    def prefetching(self, iterable, ids=None, fresh_rows: bool = True, convert=None):
        """Iterate ``iterable`` (a data loader) and fetch each next batch's rows while the
        current one trains: ``for batch in trainer.prefetching(loader): ...``. After a rollback
        it goes on from the checkpoint's batch, and in ``epochs()`` from the resumed epoch's
        batch (trainer/loop.py); ``convert``: a function applied to each batch (e.g.
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

    def drop_gradients(self) -> None:
        _drop_gradients(self._params, self.tables)

    def step(self, loss: torch.Tensor | None = None) -> None:
        """Backward (if ``loss`` is given), push gradients, take the new values. After a
        recovery (``launch --max-restarts``) ``step_count`` went back to the checkpoint's
        step: a loop driven by ``step_count`` trains those steps again."""
        if self._closed:
            raise ConfigError("Trainer.step after close()")
        if self.progress.take_void_step():     # its forward ran before a rollback: nothing of it counts
            self.drop_gradients()
            return
        try:
            self._step(loss)
        except ParamshardError as exc:
            self.progress.roll_back(exc)
            return
        if self.listeners is not None:
            self.listeners.after_step(self.step_count, loss, self.stats, self.backend.staleness())

    def log(self, **values) -> None:
        """Report values with this trainer's progress (the launcher's live table, the run
        directory, /metrics): ``loss=``, ``epoch=``, ``total_steps=`` (for an ETA),
        ``samples=`` (this step's, when the model's first input does not say), any
        metric of your own (``auc=0.78``), and ``result={...}``: the run's final figures
        (a JSON object), which `paramshard report` prints first."""
        assert self.listeners is not None, "set in __init__: a Trainer whose start failed is never returned"
        self.listeners.log(**values)

    def _step(self, loss: torch.Tensor | None) -> None:
        if loss is not None:
            try:
                loss.backward()          # collective, hybrid: DDP's allreduce runs in here
            except RuntimeError as exc:
                named = self.backend.explain_failure(exc, self.step_count)
                if named is not None:
                    raise named from None
                raise
        # A parameter the loss did not touch still takes part in the step
        # (sync servers wait for every trainer): its gradient is zero.
        grads = {name: (p.grad.detach().contiguous().view(-1).numpy() if p.grad is not None
                        else np.zeros(p.numel(), np.float32)) for name, p in self._params}
        sparse_grads = [(table.name, *table.take_gradients()) for table in self.tables.values()]
        self.backend.push(grads, sparse_grads, self.step_count, self._values)
        self.progress.advance()
        for _, p in self._params:
            p.grad = None
        if checkpointing.due(self):
            self.save()

    def save(self, directory=None, state: dict | None = None) -> None:
        """A checkpoint of the whole job at this step: every trainer calls it at the same step
        (sync mode); the chief saves what the servers hold, each trainer its own position
        (``state``: anything JSON the script needs to find its place in the data again;
        default: ``trainer.state``, which every automatic checkpoint saves too)."""
        checkpointing.save(self, directory, state)

    def pull(self) -> None:
        """Fetch the current parameter values (e.g. before evaluating in async mode)."""
        self.backend.flush()
        self.backend.pull_dense(self._values, self.backend.row_version(self.step_count))

    def export_table(self, name: str, path) -> int:
        """Write every server's rows of table ``name`` into one file (see paramshard.export)."""
        return table_io.export_table(self, name, path)

    def import_table(self, name: str, path) -> int:
        """Load rows exported by an earlier job into table ``name`` (chief only, before training)."""
        return table_io.import_table(self, name, path)

    def barrier(self, name: str = "default", timeout: float | None = None) -> None:
        """Return once every trainer that has not left called ``barrier(name)`` as often as this
        one (this trainer's pushes are on the servers first). ``timeout``: None waits up to
        10 x PARAMSHARD_TIMEOUT, math.inf as long as those waited for are alive; a trainer
        that died fails it at once. See paramshard.client.control.barrier."""
        if self._closed:
            raise ConfigError("Trainer.barrier after close()")
        if self.progress.replay_pending:
            return      # rolled back: the batch loop replays first, and every trainer skips to there
        try:
            self.progress.meet(name, lambda count, resumed: self.backend.barrier(name, count, timeout, resumed))
        except ParamshardError as exc:
            self.progress.roll_back_outside_loop(exc)

    def broadcast(self, value=None, name: str = "broadcast", timeout: float | None = None):
        """Every trainer calls it at the same point; each gets trainer 0's ``value`` (the others'
        ``value`` is ignored): trainer 0 decides ("stop", "decay the learning rate"), the others
        learn it. ``value``: None, bool, int, float, str, list or dict with str keys, at most
        64 KiB as JSON (else ConfigError). A barrier too (``name`` counts with the barriers; use
        names of its own); ``timeout`` as for ``barrier``. After a rollback past this point it
        is void until the epoch is replayed, and returns ``value`` as given (trainer/decisions.py)."""
        return decisions.broadcast(self, value, name, timeout)

    def scale_learning_rate(self, factor: float, tables=True, dense: bool = True) -> None:
        """Multiply the learning rate of the dense optimizer (``dense``) and of the tables'
        optimizers (``tables``: True every table, False none, or names) by ``factor`` (0 <
        factor <= 1e6) from the next step on: the rate becomes the configured one x the product
        of every factor so far. Every trainer calls it at the same step (after a ``broadcast``
        of the decision); the chief tells the servers, which keep it in their checkpoints. Sync
        mode: exactly between two steps."""
        decisions.scale_learning_rate(self, factor, tables, dense)

    def server_stats(self) -> list[dict]:
        return self.backend.server_stats()

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
            if leave:
                self.backend.flush()    # the last pushes count: they reach the servers before the leave
            if leave and checkpointing.unsaved(self):
                self.save()      # the final checkpoint: the last one always holds the trained model
            if leave:
                # The last records are written before the leave: server 0 sums up the run
                # directory once the last trainer left, and must find them.
                if self.listeners is not None:
                    self.listeners.close()
                self.progress.leave(functools.partial(self.backend.leave, timeout))
        finally:
            self._hang_up()

    def _hang_up(self) -> None:
        """Close sockets, the listeners and the trainers' group; the model forwards by itself again."""
        try:
            self.backend.hang_up()
        finally:
            if self.listeners is not None:
                self.listeners.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        # Leaving on an exception would let a sync job carry on without this trainer's
        # batches, as if it had finished: hang up instead, so the others stop too.
        self.close(leave=exc_type is None)


def _drop_gradients(params, tables) -> None:
    for _, p in params:
        p.grad = None
    for table in tables.values():
        table.take_gradients()


def _restore(backend, values, optimizer, params, tables, env, is_chief: bool):
    """A rollback's part on the servers (TrainerProgress.restore_with): every server back at the
    latest checkpoint, its dense values in ``values`` (the parameters), this step's gradients
    dropped. Holds the Trainer's parts, not the Trainer: a Trainer nobody holds is collected."""
    def restore():
        specs = {t.name: t.spec for t in tables.values()}
        ckpt, version = backend.roll_back(values, optimizer, specs, env.checkpoint_dir, is_chief, env.timeout)
        _drop_gradients(params, tables)
        return ckpt, (None if ckpt is not None else backend.step_of_version(version))
    return restore
