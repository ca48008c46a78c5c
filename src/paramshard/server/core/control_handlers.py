"""Server side of the control requests: hello, stats, leave, join, reset, shutdown
(client side: paramshard.client.control, client.recovery and the launcher).

They act on the server as a whole (its membership, epoch, every service),
through the ServerContext (server/core/context.py), never the server object; the data
ops live in the other services. The epoch check on every request is this
service's hook (server/core/epoch_check.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from paramshard.errors import ConfigError
from paramshard.log import get_logger
from paramshard.server.core.context import ServerContext
from paramshard.server.core.epoch_check import EpochCheck
from paramshard.server.core.replies import Reply

log = get_logger("server")

# How far one reset may move a server's epoch. The chief moves to one past the newest epoch it
# saw, and a restarted server (epoch -1) may have missed the earlier rollbacks, so a reset may
# jump a little; a huge jump is no rollback, and an epoch near 2**63 would leave no larger int64
# for the next one.
MAX_EPOCH_JUMP = 1 << 20


class ControlHandlers:
    """The control ops as a Service (server/core/api.py)."""

    def __init__(self, context: ServerContext):
        self.context = context

    def ops(self) -> dict:
        return {op: getattr(self, f"handle_{op}") for op in ("hello", "stats", "leave", "join", "reset",
                                                                   "shutdown")}

    def hooks(self) -> list:
        return [EpochCheck(self.context)]

    def stats(self) -> None:
        return None

    def on_leave(self, trainer: int) -> None:
        pass

    def reset(self) -> None:
        pass

    def handle_hello(self, header, arrays) -> Reply:
        ctx = self.context
        return Reply({"server": ctx.server_id, "mode": ctx.mode, "trainers": ctx.num_trainers,
                      "generation": ctx.epoch})

    def handle_stats(self, header, arrays) -> Reply:
        return Reply({"stats": self.context.snapshot_stats()})

    def handle_leave(self, header, arrays) -> Reply:
        ctx, trainer = self.context, header["trainer"]
        ctx.membership.leave(trainer)
        for service in ctx.services:
            service.on_leave(trainer)
        log.info("%s: trainer %d left (%d still training)", ctx.name, trainer, len(ctx.membership.live))
        return Reply()

    def handle_join(self, header, arrays) -> Reply:
        """A process takes a trainer slot of an elastic job mid-job (client/control.join). Without
        ``first_step``: a probe, answered with the steps complete here (``version``: the step in
        progress). With it: it joins from that step, which must come after the step in progress
        on every barrier here (else ``joined`` is false and the client probes again): a step's
        required set is fixed when the step before it completed, so the step in progress
        completes without the joiner, and it is required from its first step on."""
        ctx, trainer = self.context, header["trainer"]
        ctx.membership.check_can_join(trainer)
        done = max((s.steps_done() for s in ctx.services if hasattr(s, "steps_done")), default=0)
        first = header.get("first_step")
        if first is None:
            return Reply({"version": done})
        if ctx.mode.waits_every_step and first <= done:
            return Reply({"version": done, "joined": False})
        ctx.membership.join(trainer, first)
        for service in ctx.services:
            # Whatever the slot's last process left behind goes; and a step that waited for this
            # joiner under an earlier first step (a join asked again later) may complete now.
            service.on_leave(trainer)
        # What the joiner needs to go on where the job is (server 0's barrier counts:
        # server/services/trainer_barrier.py), from the services that have something to say.
        extra = {}
        for service in ctx.services:
            if hasattr(service, "on_join"):
                extra.update(service.on_join(trainer))
        log.info("%s: trainer %d joined from step %d (%d training)", ctx.name, trainer, first,
                 len(ctx.membership.live))
        return Reply({"version": done, "joined": True, **extra})

    def handle_reset(self, header, arrays) -> Reply:
        """The chief rolls the job back: drop every service's state, fail what waits, new epoch."""
        ctx = self.context
        if header["trainer"] != 0:
            raise ConfigError(f"trainer {header['trainer']} asked for a reset: only the chief (trainer 0) does")
        epoch, highest = header["epoch"], max(ctx.epoch, 0) + MAX_EPOCH_JUMP
        if epoch <= ctx.epoch:
            raise ConfigError(f"reset to epoch {epoch}: {ctx.name} is already in epoch {ctx.epoch}")
        if epoch > highest:
            raise ConfigError(f"reset to epoch {epoch}: {ctx.name} is in epoch {ctx.epoch} and moves at most "
                              f"to epoch {highest} (a rollback moves one epoch past the newest)")
        ctx.fail_waiting("reset", f"{ctx.name}: the job rolls back to a checkpoint")
        for service in ctx.services:
            service.reset()
        ctx.epoch = epoch
        log.warning("%s: reset to epoch %d: state dropped, the chief restores the latest checkpoint",
                    ctx.name, ctx.epoch)
        return Reply({"generation": ctx.epoch})

    def handle_shutdown(self, header, arrays) -> Reply:
        self.context.stop_after_replies()
        return Reply()


if TYPE_CHECKING:   # `make typecheck` checks the contract: Service (server/core/api.py)
    from paramshard.server.core.api import Service
    _service: type[Service] = ControlHandlers
