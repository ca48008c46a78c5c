"""The data-shard service on server 0: the job's shard queue (server/elastic/shard_queue.py) on
the wire. Client side: paramshard.client.shards, paramshard.data.DynamicShards.

- ``shard_register``: a data pass's task list (every trainer sends the same one).
- ``shard_next``: a task, ``finished`` or ``wait``; in sync mode it names the step that will
  train the data and waits until every trainer's report of the step two before arrived
  (server/elastic/shard_queue.py says why two), so all of them get the same verdict for a step.
- ``shard_progress``: a step's report (sent with the step's push, client/step.py). It carries the
  ``lease`` its task was handed out under (``shard_next`` replies name it); one of an older lease
  (a rollback restored the queue since) is answered ``dropped`` and changes no task.
- ``shard_snapshot`` / ``shard_restore``: the queue as JSON for a checkpoint (the chief,
  client/checkpoint.py); a snapshot leaves out reports past the checkpoint's cut and waits
  for the reports up to it.

A trainer that leaves, or is lost for longer than the grace period (Membership.gone),
gives its task's remainder back to the queue. Requests of another job epoch (a rollback
happened since) are refused, as data requests are (server/core/epoch_check.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from paramshard.errors import ConfigError, StaleEpoch
from paramshard.log import get_logger
from paramshard.server.core.context import ServerContext
from paramshard.server.core.replies import Deferred, Reply
from paramshard.server.elastic.shard_queue import TASK, WAIT, ShardQueue

log = get_logger("server")
OPS = ("shard_register", "shard_next", "shard_progress", "shard_snapshot", "shard_restore")


class ShardService:
    def __init__(self, context: ServerContext):
        self.context = context
        self.queue = ShardQueue(context.num_trainers)

    def ops(self) -> dict:
        return {op: getattr(self, f"handle_{op}") for op in OPS}

    def hooks(self) -> list:
        return []

    def stats(self) -> None:
        return None

    def on_leave(self, trainer: int) -> None:
        self._release(trainer, "left")

    def reset(self) -> None:
        self.queue.reset()          # the chief restores the checkpoint's queue next

    def _release(self, trainer: int, why: str) -> None:
        for task in self.queue.release(trainer):
            log.warning("%s: trainer %d %s: its data task %d goes back to the queue from position %d",
                        self.context.name, trainer, why, task, self.queue.position[task])

    def _check(self, header: dict, arrays: list) -> int:
        ctx, trainer, op = self.context, header["trainer"], header["op"]
        if ctx.server_id != 0:
            raise ConfigError(f"{op} sent to {ctx.name}: the data-shard service runs on server 0 only")
        if arrays:
            raise ConfigError(f"{op} carries no arrays, got {len(arrays)}")
        ctx.membership.check_trainer(trainer)
        if header.get("epoch", ctx.epoch) != ctx.epoch:
            raise StaleEpoch(f"{op} of epoch {header['epoch']} refused: {ctx.name} is in epoch {ctx.epoch}")
        for gone in sorted(ctx.membership.gone):
            if self.queue.holding.get(gone):
                self._release(gone, "was lost")
        return trainer

    # -- handlers ------------------------------------------------------------------
    def handle_shard_register(self, header: dict, arrays: list) -> Reply:
        trainer = self._check(header, arrays)
        got = self.queue.register(header["pass"], header["fingerprint"], header["files"], header["tasks"],
                                  trainer, header.get("step"), header.get("session"))
        return Reply({"registered": got, "pass": self.queue.pass_})

    def handle_shard_next(self, header: dict, arrays: list) -> Reply | Deferred:
        trainer = self._check(header, arrays)
        self.context.membership.check_not_left(trainer, "ask for a data task")
        pass_, step = header["pass"], header.get("step")
        if step is None:
            return self._next(trainer, pass_, None)
        membership = self.context.membership
        missing = lambda: self.queue.reports_missing(step - 2, membership.required)   # noqa: E731
        if not missing():
            return self._next(trainer, pass_, step)
        return Deferred(ready=lambda: not missing(), make_reply=lambda: self._next(trainer, pass_, step),
                        describe=lambda: f"data task for step {step} waits for the shard reports of step "
                                         f"{step - 2} of trainers {missing()}",
                        waits_on=missing)

    def _next(self, trainer: int, pass_: int, step: int | None) -> Reply:
        verdict, task = self.queue.next(trainer, pass_, step)
        if verdict == TASK:
            return Reply({"verdict": verdict, "task": task, "lease": self.queue.lease})
        if verdict == WAIT:
            held_by, mark = self.queue.waiting_on()
            return Reply({"verdict": verdict, "held_by": held_by, "mark": mark})
        return Reply({"verdict": verdict})

    def handle_shard_progress(self, header: dict, arrays: list) -> Reply:
        trainer = self._check(header, arrays)
        taken = self.queue.progress(trainer, header["pass"], header["step"], header["task"], header["position"],
                                    header["done"], header.get("lease"))
        if taken:
            return Reply()
        log.info("%s: trainer %d reported data task %d handed out before the queue was restored (a rollback): "
                 "dropped; the task goes on from the restored position", self.context.name, trainer, header["task"])
        return Reply({"dropped": [header["task"]]})

    def handle_shard_snapshot(self, header: dict, arrays: list) -> Reply | Deferred:
        self._check(header, arrays)
        after = header.get("after")
        if after is not None:
            if not all(isinstance(c, list) and len(c) == 2 and all(type(x) is int for x in c) for c in after):
                raise ConfigError("shard_snapshot: 'after' must be a list of [trainer, step] pairs")
            cut = {t: k for t, k in after}
        else:
            cut = None
        membership = self.context.membership

        def missing() -> list[int]:
            if cut is None:
                return []
            out = [t for t, k in cut.items() if t in self.queue.reported and self.queue.reported[t] < k]
            # Elastic: a trainer whose connection dropped is not waited for (its tasks went back to
            # the queue from what it reported): the steps up to the cut went on without it.
            lost = set(membership.lost_since) if membership.elastic else set()
            return sorted(t for t in out if t not in membership.left and t not in membership.gone and t not in lost)

        make = lambda: Reply({"state": self.queue.snapshot(cut)})     # noqa: E731
        if not missing():
            return make()
        return Deferred(ready=lambda: not missing(), make_reply=make,
                        describe=lambda: f"the shard snapshot waits for the reports up to the cut of trainers "
                                         f"{missing()}", waits_on=missing)

    def handle_shard_restore(self, header: dict, arrays: list) -> Reply:
        trainer = self._check(header, arrays)
        if trainer != 0:
            raise ConfigError(f"trainer {trainer} tried to restore the shard queue: only the chief does")
        state = header["state"]
        if not isinstance(state, dict):
            raise ConfigError("shard_restore: 'state' must be a map")
        self.queue.restore(state)
        return Reply({"pass": self.queue.pass_, "pending": len(self.queue.pending)})


if TYPE_CHECKING:   # `make typecheck` checks the contract: Service (server/core/api.py)
    from paramshard.server.core.api import Service
    _service: type[Service] = ShardService
