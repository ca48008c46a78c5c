"""The contract between the server loop and what it serves.

A ``Service`` (dense blocks, sparse tables, checkpoints, control, barriers)
names the ops it handles and the request hooks it declares (server/core/hooks.py),
adds to the server's statistics and hears when a trainer leaves or the job
rolls back. The server owns the socket, the loop and the statistics; services
own state and see the server only through a ServerContext (server/core/context.py).
"""
from __future__ import annotations

from typing import Callable, Protocol

from paramshard.messages.server_stats import StatsPart
from paramshard.server.core.replies import Deferred, Reply

Handler = Callable[[dict, list], "Reply | Deferred"]


class Service(Protocol):
    def ops(self) -> dict[str, Handler]:
        """op name -> handler(header, arrays)."""

    def hooks(self) -> list:
        """RequestHooks run on every request before its handler (server/core/hooks.py); usually none."""

    def stats(self) -> "StatsPart | None":
        """This service's part of the server's ``stats`` reply (messages/server_stats.py), or None."""

    def on_leave(self, trainer: int) -> None:
        """``trainer`` left the job: finish steps that only waited for it."""

    def reset(self) -> None:
        """Drop all state: the job rolls back to a checkpoint (the chief restores it next)."""

    # Optional: ``steps_done() -> int``, the steps this service completed (a service with
    # step barriers has it); an elastic job's joiner starts after the highest (handle_join).
