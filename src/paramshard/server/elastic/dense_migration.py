"""Moving dense blocks between servers (the dense half of docs/DESIGN.md 5f).

A Service on every server of an elastic job, beside the sparse MigrationService (whose routing
carries the block map too, and whose armed sync switch it follows). A block is, here: held (in
the DenseStore and not handed away), incoming (handed to this server: requests naming it are
held until it is imported), or gone (handed away: requests naming it are refused whole with
``moved``, before anything is applied, and the client resends them to the new owner under the
routing server 0 publishes first).

A move of blocks (launch/elastic/server_scaling.py drives it): ``dense_expect`` on the new owner,
``dense_freeze`` on the old one (sync: once the blocks completed the step before the switch),
``dense_export`` (values, optimizer slots, versions, plan, optimizer, learning-rate scale; async:
the staleness clocks, so the new owner's bound counts the steps the blocks carry),
``dense_import`` on the new owner (its held requests run), ``dense_finish`` on the old owner
(drops what it handed away). A block is frozen and exported whole at once: dense blocks are
few and small next to tables, so there is no background copy.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING


from paramshard.errors import ConfigError, Moved
from paramshard.optim import from_wire
from paramshard.server.core.context import ServerContext
from paramshard.server.storage.dense_store import DenseStore
from paramshard.server.core.hooks import Incoming, Verdict
from paramshard.server.elastic.move_holds import MoveHolds
from paramshard.server.core.replies import Deferred, Reply

DENSE_OPS = ("pull_dense", "push_dense")


class DenseMoveHook:
    """Refuses, holds or accepts each dense request by the blocks it names."""

    def __init__(self, service: "DenseMigration"):
        self.service = service

    def admit(self, request: Incoming) -> Verdict:
        if request.op not in DENSE_OPS or request.held is None or not self.service.elastic:
            return Verdict.ACCEPT
        step = None
        if self.service.ctx.mode.waits_every_step:
            step = request.header.get("step" if request.op == "push_dense" else "min_version")
        verdict = self.service.verdict(request.header["names"], request.header.get("routing"), step)
        if verdict is Verdict.HOLD:
            self.service.hold(request.held)
        return verdict

    def applied(self, request: Incoming) -> None:
        pass

    def tick(self) -> None:
        self.service.ctx.resubmit(self.service.expired(self.service.ctx.timeout))


class DenseMigration:
    def __init__(self, context: ServerContext, dense: DenseStore, migration=None, clock=time.monotonic):
        """``migration``: the sparse MigrationService (its routing says whether the job is elastic;
        its armed switch is the sync step at which the routing changes)."""
        self.ctx, self.dense, self.migration, self.clock = context, dense, migration, clock
        self.incoming: set[str] = set()
        # Handed away (dropped at dense_finish, refused from the freeze): the store's own set, so its
        # bounded-staleness replies see a freeze (server/services/dense_handlers.py).
        self.gone: set[str] = dense.handed_away
        # The server's one queue of requests a move holds (shared with the sparse partitions').
        self.holds = migration.ownership.holds if migration is not None else MoveHolds(clock)
        self.holds.on_expire.append(self.incoming.clear)

    @property
    def elastic(self) -> bool:
        return self.migration is not None and self.migration.ownership.elastic

    @property
    def switch(self):
        return self.migration.ownership.switch if self.migration is not None else None

    def ops(self) -> dict:
        return {op: getattr(self, f"handle_{op}") for op in
                ("dense_held", "dense_expect", "dense_freeze", "dense_export", "dense_import", "dense_finish")}

    def hooks(self) -> list:
        return [DenseMoveHook(self)]

    def stats(self):
        return None

    def on_leave(self, trainer: int) -> None:
        pass

    def reset(self) -> None:
        self.incoming.clear()
        self.gone.clear()

    # -- requests ------------------------------------------------------------
    def verdict(self, names: list, routing_version: int | None, step: int | None) -> Verdict:
        switch = self.switch
        if switch is not None and step is not None and step >= switch[0]:
            if routing_version is None or routing_version < switch[1]:
                raise Moved(f"server {self.ctx.server_id}: from step {switch[0]} on the job routes by routing "
                            f"version {switch[1]}, this dense request is of version {routing_version}; fetch "
                            f"the routing (routing_get on server 0) and resend")
            if self.incoming and self.migration.ownership.holding:     # this move's switch (see there)
                return Verdict.HOLD
        # Only blocks handed away are refused: a name never here is a model that differs from the
        # chief's, which the handler reports as such (a client never learns of a block on a
        # server no routing put it on).
        stray = [n for n in names if n in self.gone and n not in self.incoming]
        if stray:
            raise Moved(f"server {self.ctx.server_id} does not hold dense blocks {stray[:3]} (the request's "
                        f"routing version {routing_version}): they moved to another server; fetch the routing "
                        f"(routing_get on server 0) and resend")
        if any(n in self.incoming for n in names):
            return Verdict.HOLD
        return Verdict.ACCEPT

    @property
    def held(self) -> list:
        return self.holds.held

    def hold(self, request) -> None:
        self.holds.hold(request)

    def _take_held(self) -> list:
        return self.holds.take()

    def expired(self, timeout: float) -> list:
        """Held longer than ``timeout`` (the move stalled): nothing is expected, run them again (refused)."""
        return self.holds.expired(timeout)

    # -- the coordinator's view ------------------------------------------------
    def handle_dense_held(self, header: dict, arrays: list) -> Reply:
        """The blocks served here and their bytes (the move's starting map before any move)."""
        held = {n: int(b.values.nbytes) for n, b in self.dense.blocks.items() if n not in self.gone}
        return Reply({"blocks": held, "registered": self.dense.registered})

    # -- the old owner -----------------------------------------------------------
    def handle_dense_freeze(self, header: dict, arrays: list) -> Reply | Deferred:
        names = header["names"]
        self._check_elastic("dense_freeze")
        self.dense.lookup(names)

        def freeze() -> Reply:
            self.gone.update(names)
            return Reply()

        switch = self.switch
        if switch is None:
            return freeze()
        # Sync: once these blocks completed the step before the switch (no request of a later
        # step is applied here: it is refused, its routing is too old).
        return Deferred(ready=lambda: all(self.dense.blocks[n].version >= switch[0] for n in names),
                        make_reply=freeze,
                        describe=lambda: f"dense blocks to complete step {switch[0] - 1} before the hand-off",
                        waits_on=lambda: self.dense.waiting_for(names))

    def handle_dense_export(self, header: dict, arrays: list) -> Reply:
        names = header["names"]
        if not set(names) <= self.gone:
            raise ConfigError("dense_export: freeze these blocks first (dense_freeze)")
        fields, out = self.dense.export_blocks(names)
        return Reply(fields, out)

    def handle_dense_finish(self, header: dict, arrays: list) -> Reply:
        dropped = self.dense.drop_blocks(sorted(self.gone))
        return Reply({"dropped": dropped})

    # -- the new owner -------------------------------------------------------------
    def handle_dense_expect(self, header: dict, arrays: list) -> Reply:
        self._check_elastic("dense_expect")
        names = header["names"]
        here = [n for n in names if n in self.dense.blocks and n not in self.gone]
        if here:
            raise ConfigError(f"dense_expect: server {self.ctx.server_id} already holds blocks {here[:3]}")
        self.migration.ownership.expecting()      # an earlier move's switch holds nothing any more
        self.incoming.update(names)
        return Reply()

    def handle_dense_import(self, header: dict, arrays: list) -> Reply:
        names = header["names"]
        if not set(names) <= self.incoming:
            raise ConfigError(f"dense_import: server {self.ctx.server_id} was not expecting all of these blocks")
        # Blocks handed away earlier and coming back: the old copy goes first.
        self.dense.drop_blocks([n for n in names if n in self.gone])
        self.dense.import_blocks(names, header["versions"], header["slots"], list(arrays),
                                 from_wire(header["optimizer"]), header["plan_fingerprint"], header["lr_scale"],
                                 header.get("clocks"))
        self.gone.difference_update(names)
        self.incoming.difference_update(names)
        self.ctx.resubmit(self._take_held())        # admitted again: held again if still waiting
        return Reply({"blocks": len(names)})

    # -- an aborted move (the sparse MigrationService's migrate_abort / handoff_undo) ------------
    def abort_incoming(self, names: list) -> list:
        """Stop expecting ``names``; those of them held here (imported before the abort)."""
        self.incoming.difference_update(names)
        self.ctx.resubmit(self._take_held())
        return [n for n in names if n in self.dense.blocks and n not in self.gone]

    def undo_freeze(self, names: list) -> list:
        """Serve again the frozen ``names`` no new owner took; those taken back."""
        back = [n for n in names if n in self.gone]
        self.gone.difference_update(back)
        return back

    def _check_elastic(self, what: str) -> None:
        if not self.elastic:
            raise ConfigError(f"{what}: this job routes by a fixed hash (PARAMSHARD_PARTITIONS=0): its dense "
                              f"blocks cannot move")


def attach_dense_migration(server, migration) -> DenseMigration:
    service = DenseMigration(server.context, server.dense, migration)
    server.add_service(service)
    return service


if TYPE_CHECKING:   # `make typecheck` checks the contract: Service (server/core/api.py), RequestHook (server/core/hooks.py)
    from paramshard.server.core.api import Service
    from paramshard.server.core.hooks import RequestHook
    _service: type[Service] = DenseMigration
    _request_hook: type[RequestHook] = DenseMoveHook
