"""The epoch as a request hook: data requests and barriers of another epoch are refused.

After a rollback (``reset``, control_handlers.py) the job is in a new epoch; a
request sent before it (a push of the abandoned step, a barrier entered before
the rollback) must not count after it. A server restarted in place is in epoch
-1 until the chief resets it, so it serves no data meanwhile, and takes no
trainer's leave (it would end the job without the model).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from paramshard.errors import StaleEpoch
from paramshard.server.core.context import ServerContext
from paramshard.server.core.hooks import Incoming, Verdict

DATA_OPS = ("push_dense", "push_sparse", "pull_dense", "pull_sparse")
EPOCH_OPS = DATA_OPS + ("barrier", "scale_lr")


class EpochCheck:
    """A RequestHook (server/core/hooks.py)."""

    def __init__(self, context: ServerContext):
        self.context = context

    def admit(self, request: Incoming) -> Verdict:
        epoch, header = self.context.epoch, request.header
        if request.op == "leave" and epoch < 0:
            # The trainers leave after their final checkpoint; this server, restarted since, holds
            # none of it: ending the job now would end it without the trained model (and its
            # deltas). Refused like a data request: the chief restores the checkpoint, then the
            # trainer leaves again (TrainerProgress.leave).
            raise StaleEpoch(f"leave of trainer {header.get('trainer')} refused: {self.context.name} was restarted "
                             f"and holds nothing until the chief restores the latest checkpoint")
        if request.op in EPOCH_OPS and header.get("epoch", epoch) != epoch:
            raise StaleEpoch(f"{request.op} of epoch {header['epoch']} refused: {self.context.name} is in epoch "
                             f"{epoch}" + (" (restarted, waiting for the chief to restore the "
                                           "checkpoint)" if epoch < 0 else
                                           " (the job rolled back to a checkpoint)"))
        return Verdict.ACCEPT

    def applied(self, request: Incoming) -> None:
        pass

    def tick(self) -> None:
        pass


if TYPE_CHECKING:   # `make typecheck` checks the contract: RequestHook (server/core/hooks.py)
    from paramshard.server.core.hooks import RequestHook
    _request_hook: type[RequestHook] = EpochCheck
