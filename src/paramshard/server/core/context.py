"""What a service may see and do of the server it runs in: a narrow context, not the server.

The core (parameter_server.py) owns the socket, the loop and the statistics; a
service gets this object instead, with the job's membership, the server's
identity and epoch, the one waiting list (to void what waits), a way to hand held
requests back to the core (``resubmit``), the other services (a leave or a reset
reaches each of them) and a way to end serving once the replies are out.
"""
from __future__ import annotations

from typing import Callable

from paramshard.mode import Mode
from paramshard.server.core.barrier import Membership
from paramshard.server.core.waiting import WaitingList


class ServerContext:
    def __init__(self, server_id: int, mode: Mode, membership: Membership, timeout: float,
                 waiting: WaitingList, epoch: int = 0,
                 resubmit: Callable[[list], None] | None = None,
                 snapshot_stats: Callable[[], dict] | None = None):
        self.server_id = server_id
        self.name = f"server {server_id}"
        self.mode = mode
        self.membership = membership
        self.num_trainers = membership.num_trainers
        self.timeout = timeout
        self.waiting = waiting
        # The job's epoch (client/recovery.py): requests of another epoch are refused. A server
        # restarted in place starts at -1: it serves nothing until the chief resets it.
        self.epoch = epoch
        self._resubmit = resubmit
        self._snapshot_stats = snapshot_stats
        self.services: list = []            # every service, in the order added (leave and reset reach each)
        self.stopping = False               # set by shutdown: finish answering, then stop
        # Removed by a scale (its routing names it "", or ``retire``): trainers and peers close their
        # connections to it as they learn the routing, an orderly leave rather than a loss.
        self.retired = False

    def resubmit(self, held: list) -> None:
        """Run requests a hook held back, in this order, as if they had just arrived."""
        resubmit = self._resubmit
        if resubmit is None:
            if held:
                raise RuntimeError(f"{self.name}: {len(held)} held requests and nothing to run them")
            return
        for request in held:
            resubmit(request)

    def fail_waiting(self, code: str, message: str) -> None:
        """Answer every waiting request with an error (a reset voids them)."""
        self.waiting.fail_all(code, message)

    def snapshot_stats(self) -> dict:
        return self._snapshot_stats() if self._snapshot_stats is not None else {}

    def stop_after_replies(self) -> None:
        self.stopping = True
