"""A checkpoint's page-by-page read of a table, and the drop it must not overlap.

``snapshot_sparse`` hands a table out in pages by row position. The end of a server move
(``migrate_finish``: the old owner drops the rows it handed away) compacts the rows, so a
read spanning it would skip some rows and repeat others. ``SnapshotReads`` notes the tables
whose read started and has pages still to come; ``DropGuard``, a RequestHook, holds a
``migrate_finish`` until none is (or each read is older than the timeout: a chief that died
mid-read), then hands it back to run. Nothing a read waits for depends on the drop.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING


from paramshard.server.core.hooks import Incoming, Verdict

DROP_OPS = ("migrate_finish",)


class SnapshotReads:
    def __init__(self, timeout: float, clock=time.monotonic):
        self.timeout, self.clock = timeout, clock
        self.open: dict[str, float] = {}          # table -> when its read started

    def served(self, table: str, start: int, count: int, rows: int) -> None:
        if start + count >= rows:
            self.open.pop(table, None)
        elif start == 0:
            self.open[table] = self.clock()

    def busy(self) -> bool:
        now = self.clock()
        self.open = {t: since for t, since in self.open.items() if now - since <= self.timeout}
        return bool(self.open)

    def clear(self) -> None:
        self.open.clear()


class DropGuard:
    def __init__(self, reads: SnapshotReads, context):
        self.reads, self.context = reads, context
        self.held: list = []

    def admit(self, request: Incoming) -> Verdict:
        if request.op in DROP_OPS and request.held is not None and self.reads.busy():
            self.held.append(request.held)
            return Verdict.HOLD
        return Verdict.ACCEPT

    def applied(self, request: Incoming) -> None:
        if request.op == "snapshot_sparse":
            self.tick()

    def tick(self) -> None:
        if self.held and not self.reads.busy():
            held, self.held = self.held, []
            self.context.resubmit(held)


if TYPE_CHECKING:   # `make typecheck` checks the contract: RequestHook (server/core/hooks.py)
    from paramshard.server.core.hooks import RequestHook
    _request_hook: type[RequestHook] = DropGuard
