"""Server side of the control requests: hello, stats, leave, reset, shutdown
(client side: paramshard.client.control, client.recovery and the launcher).

They act on the server as a whole (its membership, epoch, every service), so
the handlers hold the server; the data ops live in the other services.
"""
from __future__ import annotations

from ..errors import ConfigError
from ..log import get_logger
from .replies import Reply

log = get_logger("server")

# How far one reset may move a server's epoch. The chief moves to one past the newest epoch it
# saw, and a restarted server (epoch -1) may have missed the earlier rollbacks, so a reset may
# jump a little; a huge jump is no rollback, and an epoch near 2**63 would leave no larger int64
# for the next one.
MAX_EPOCH_JUMP = 1 << 20


class ControlHandlers:
    """The control ops as a Service (server/api.py)."""

    def __init__(self, server):
        self.server = server

    def ops(self) -> dict:
        return {op: getattr(self, f"handle_{op}") for op in ("hello", "stats", "leave", "reset", "shutdown")}

    def stats(self) -> None:
        return None

    def on_leave(self, trainer: int) -> None:
        pass

    def reset(self) -> None:
        pass

    def handle_hello(self, header, arrays) -> Reply:
        srv = self.server
        return Reply({"server": srv.server_id, "mode": srv.mode, "trainers": srv.num_trainers,
                      "generation": srv.generation})

    def handle_stats(self, header, arrays) -> Reply:
        return Reply({"stats": self.server.snapshot_stats()})

    def handle_leave(self, header, arrays) -> Reply:
        srv, trainer = self.server, header["trainer"]
        srv.membership.leave(trainer)
        for service in srv.services:
            service.on_leave(trainer)
        log.info("%s: trainer %d left (%d still training)", srv.name, trainer, len(srv.membership.live))
        return Reply()

    def handle_reset(self, header, arrays) -> Reply:
        """The chief rolls the job back: drop every service's state, fail what waits, new epoch."""
        srv = self.server
        if header["trainer"] != 0:
            raise ConfigError(f"trainer {header['trainer']} asked for a reset: only the chief (trainer 0) does")
        epoch, highest = header["epoch"], max(srv.generation, 0) + MAX_EPOCH_JUMP
        if epoch <= srv.generation:
            raise ConfigError(f"reset to epoch {epoch}: {srv.name} is already in epoch {srv.generation}")
        if epoch > highest:
            raise ConfigError(f"reset to epoch {epoch}: {srv.name} is in epoch {srv.generation} and moves at most "
                              f"to epoch {highest} (a rollback moves one epoch past the newest)")
        srv.fail_waiting("reset", f"{srv.name}: the job rolls back to a checkpoint")
        for service in srv.services:
            service.reset()
        srv.generation = epoch
        log.warning("%s: reset to epoch %d: state dropped, the chief restores the latest checkpoint",
                    srv.name, srv.generation)
        return Reply({"generation": srv.generation})

    def handle_shutdown(self, header, arrays) -> Reply:
        self.server.stop_after_replies()
        return Reply()
