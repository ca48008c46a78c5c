"""Moving sparse partitions between servers while training goes on (the server's side).

A move of partitions (placement/partitions.py) from an old owner to a new one, driven by
placement/move_plan.py (run by client/move_runner.py):

1. ``migrate_start`` (old owner): begin tracking the ids requests touch in those partitions;
   ``migrate_expect`` (new owner): hold requests for them until their rows are here.
2. ``migrate_page`` / ``migrate_stage``: the partitions' rows (values, optimizer state,
   update counts, last-seen clocks) and admission counters travel in pages while the old
   owner keeps serving; the new owner keeps them aside (staged).
3. Per group of partitions: the routing naming the new owner is published on server 0
   (``routing_set``), then ``handoff_freeze`` (old owner: requests for them are refused with
   ``moved`` from now on), ``handoff_rows`` -> ``handoff_in`` (the partitions' current ids and
   the dirty rows, whole), ``handoff_done`` (new owner: staged rows still current and not
   dirty, plus the dirty ones, become rows; the held requests run).
4. ``migrate_finish`` (old owner): the rows of partitions handed away are dropped, a slice at
   a time between requests (SparseTable.drop_later / drop_some), so no request waits on it.

An aborted move (placement/move_plan.py): ``migrate_abort`` (new owner: stop expecting, say
which partitions it took) and ``handoff_undo`` (old owner: serve again what it froze and
nobody took).

Requests are checked by a RequestHook (partition_ownership.py). The routing every server
knows is answered by ``routing_get``; server 0's is the job's, and its reply also says the
newest routing version each trainer's requests carried (``trainers``): a server a scale
removed is stopped (``retire`` with ``exit``) once every trainer routes by a version that
names it retired, so none will send it anything again (launch/elastic/elastic_servers.py). A routing
set on a server also tells it which peer servers to watch (``ParameterServer.follow_peers``).
"""
from __future__ import annotations

import time

import numpy as np
from typing import TYPE_CHECKING, Callable


from paramshard.env import ClusterEnv
from paramshard.errors import ConfigError
from paramshard.placement.partitions import Routing
from paramshard.tables import policy_to_wire
from paramshard.transport import protocol
from paramshard.server.core.context import ServerContext
from paramshard.server.core.hooks import Incoming, Verdict
from paramshard.server.elastic.partition_intake import PartitionIntake, checked_page
from paramshard.server.elastic.partition_ownership import PartitionOwnership
from paramshard.server.core.replies import Deferred, Reply
from paramshard.server.services.sparse_service import SparseService

if TYPE_CHECKING:
    from paramshard.server.elastic.dense_migration import DenseMigration    # attach_migration imports it on use

DATA_OPS = ("pull_sparse", "push_sparse", "import_sparse")
MAX_PAGE_ROWS = 1 << 20
DROP_BUDGET_S = 0.02       # a tick's share of a drop under way (ticks come about 10 times a second)


class MigrationHook:
    """Refuses, holds or accepts each sparse request by the partitions of its ids."""

    def __init__(self, service: "MigrationService"):
        self.service = service

    def admit(self, request: Incoming) -> Verdict:
        own = self.service.ownership
        version, trainer = request.header.get("routing"), request.header.get("trainer")
        if own.elastic and type(version) is int and type(trainer) is int:
            seen = self.service.routing_seen
            seen[trainer] = max(version, seen.get(trainer, -1))
        if not own.elastic or request.op not in DATA_OPS or request.held is None:
            return Verdict.ACCEPT
        step = None
        if self.service.ctx.mode.waits_every_step:
            step = request.header.get("step" if request.op == "push_sparse" else "min_version")
        verdict = own.verdict(_ids_of(request), request.header.get("routing"), step)
        if verdict is Verdict.HOLD:
            own.hold(request.held)
        return verdict

    def applied(self, request: Incoming) -> None:
        own = self.service.ownership
        if own.elastic and request.op in DATA_OPS and request.held is not None and own.copying.any():
            own.note_applied(request.header["table"], _ids_of(request))

    def tick(self) -> None:
        expired = self.service.ownership.expired(self.service.ctx.timeout)
        if expired:
            self.service.drop_strays()          # rows taken in for partitions no longer expected
        self.service.ctx.resubmit(expired)
        self.service.drop_some()


def _ids_of(request: Incoming) -> np.ndarray:
    """The ids array of a sparse request (its first frame after the header)."""
    arrays = protocol.decode_arrays(request.header, request.held[2:])
    return arrays[0] if arrays and arrays[0].dtype == np.uint64 and arrays[0].ndim == 1 else np.zeros(0, np.uint64)


class MigrationService:
    def __init__(self, context: ServerContext, sparse: SparseService, routing: Routing):
        self.ctx, self.sparse = context, sparse
        sparse.on_late_push = self._late_push
        self.ownership = PartitionOwnership(context.server_id, routing)
        self.intake = PartitionIntake(self.ownership.partitions)     # the new owner's side: pages become rows
        self.evicted_at_start: dict[str, int] = {}
        self._row_partitions: dict[str, tuple[int, np.ndarray]] = {}   # table -> (evicted, partition by row)
        self.routing_seen: dict[int, int] = {}      # trainer -> the newest routing version its requests carried
        self.on_addresses = None     # told every routing's addresses (ParameterServer.follow_peers)
        self.dense_moves: DenseMigration | None = None      # the DenseMigration beside it (an abort undoes both)
        # Restored from a replica: rows of partitions this server does not own may have come back
        # with it (taken in for a move, or handed away and not dropped yet when it died); they go
        # before any of those partitions is expected here again.
        self._strays_unknown = False

    def ops(self) -> dict:
        return {op: getattr(self, f"handle_{op}") for op in
                ("routing_get", "routing_set", "migrate_switch", "migrate_tables", "migrate_tables_in", "migrate_start",
                 "migrate_expect", "migrate_page", "migrate_stage", "handoff_freeze", "handoff_rows",
                 "handoff_in", "handoff_done", "migrate_finish", "migrate_abort", "handoff_undo", "retire")}

    def hooks(self) -> list:
        return [MigrationHook(self)]

    def stats(self):
        return None

    def on_leave(self, trainer: int) -> None:
        pass

    def reset(self) -> None:
        self.intake.clear()

    # -- routing ------------------------------------------------------------
    def handle_routing_get(self, header: dict, arrays: list) -> Reply:
        # The trainers that may still send requests (arrived, not left) and the newest routing
        # version each one's requests carried (-1: none yet).
        members = self.ctx.membership
        training = sorted(set(members.live) - set(members.never_arrived()))
        return Reply({"routing": self.ownership.routing.to_wire(),
                      "trainers": [[t, self.routing_seen.get(t, -1)] for t in training]})

    def handle_routing_set(self, header: dict, arrays: list) -> Reply:
        routing = Routing.from_wire(header["routing"])
        if header.get("restored") is True:
            # Restored (the replica keeper's restore, a checkpoint's rollback): this server owns
            # what the job's routing says, whatever map it started with (a restart in place).
            self.ownership.restore(routing)
            self._strays_unknown = True
        else:
            self.ownership.set_routing(routing, join=header.get("join") is True)
        addresses = self.ownership.routing.addresses
        me = self.ctx.server_id
        if me and me < len(addresses) and not addresses[me]:
            self.ctx.retired = True         # the move's final routing removed this server
        if self.on_addresses is not None:
            self.on_addresses(addresses)
        return Reply({"version": self.ownership.routing.version})

    def handle_migrate_switch(self, header: dict, arrays: list) -> Reply:
        """Sync mode: the routing of ``version`` takes over at step ``step``, which no request
        may have reached yet: a table at step >= step - 1 may have a pull of it waiting already."""
        step, version = header["step"], header["version"]
        if not self.ctx.mode.waits_every_step:
            raise ConfigError("migrate_switch is for sync mode; an async job changes routing partition by partition")
        late = {n: t.version for n, t in self.sparse.tables.items() if t.version + 2 > step}
        if late:
            raise ConfigError(f"migrate_switch: step {step} is too close, tables are at {late}; choose a later step")
        self.ownership.arm(step, version)
        return Reply()

    # -- tables on a new server --------------------------------------------
    def handle_migrate_tables(self, header: dict, arrays: list) -> Reply:
        tables = []
        for name, t in self.sparse.tables.items():
            tables.append({"table": name, "dim": t.dim, "seed": t.seed, "optimizer": t.optimizer.to_wire(),
                           "policy": policy_to_wire(t.admission, t.eviction, t.init_scale), "dtype": t.dtype,
                           "rounding": t.rounding, "version": t.version, "lr_scale": t.lr_scale,
                           **({"memory_budget": t.memory_budget} if t.memory_budget is not None else {})})
        return Reply({"tables": tables, "sync": self.ctx.mode.waits_every_step})

    def handle_migrate_tables_in(self, header: dict, arrays: list) -> Reply:
        fields = {"table", "dim", "seed", "optimizer", "policy", "dtype", "rounding", "version", "lr_scale"}
        for entry in header["tables"]:
            if not isinstance(entry, dict) or not fields <= set(entry) <= fields | {"reserve", "memory_budget"}:
                raise ConfigError("migrate_tables_in: each table must be a migrate_tables entry (and a reserve)")
            register = {k: entry[k] for k in ("table", "dim", "seed", "optimizer", "policy", "dtype", "rounding",
                                              "reserve", "memory_budget") if k in entry}
            protocol.validate_request({"op": "register_sparse", "trainer": 0, **register})
            self.sparse.handle_register_sparse({"trainer": 0, **register}, [])
            table = self.sparse.table(entry["table"])
            if type(entry["version"]) is not int or entry["version"] < 0:
                raise ConfigError("migrate_tables_in: version must be an int >= 0")
            table.version = max(table.version, entry["version"])
            if entry["lr_scale"] != table.lr_scale:
                table.set_lr_scale(float(entry["lr_scale"]))
        return Reply({"tables": sorted(self.sparse.tables)})

    # -- the old owner -------------------------------------------------------
    def handle_migrate_start(self, header: dict, arrays: list) -> Reply | Deferred:
        # A drop of the last move still under way finishes first, a slice a tick (the pages are
        # read by row position); the move waits for it, not the requests served meanwhile.
        return self._after_drops(lambda: self._start_copy(header), "migrate_start")

    def _start_copy(self, header: dict) -> Reply:
        self.ownership.start_copy(header["partitions"])
        # Sync: a push received before the copy began is applied when its step completes, maybe
        # after its rows were copied: its rows are dirty from now on, as if it came now.
        for name, table in self.sparse.tables.items():
            pending = [ids[rows >= 0] for rows, _, ids in table._pending.values() if len(rows)]
            if pending:
                self.ownership.note_applied(name, np.unique(np.concatenate(pending)))
        self._row_partitions = {}
        self.evicted_at_start = {n: t.evicted for n, t in self.sparse.tables.items()}
        return Reply({"rows": {n: t.num_rows for n, t in self.sparse.tables.items()}})

    def _after_drops(self, then, op: str) -> Reply | Deferred:
        """``then()`` once no drop is under way here. A move right after another (3 -> 2 right after
        2 -> 3) met the last one's drop still going: finishing it at once stalled every request
        for a second on millions of rows; the hook's ticks finish it a slice at a time instead,
        and the move waits."""
        dropping = lambda: any(t.dropping for t in self.sparse.tables.values())    # noqa: E731
        if not dropping():
            return then()

        def ready() -> bool:
            # A move waits on it: a slice every turn of the loop (between batches of requests,
            # about DROP_BUDGET_S each), not only every tick.
            if dropping():
                self.drop_some()
            return not dropping()
        return Deferred(ready=ready, make_reply=then,
                        describe=lambda: f"{op}: the rows handed away by the last move to be dropped first "
                                         f"({sum(t.num_rows for t in self.sparse.tables.values())} rows held)")

    def handle_migrate_page(self, header: dict, arrays: list) -> Reply:
        table = self.sparse.table(header["table"])
        start, count = header["start"], header["count"]
        if start < 0 or not 0 < count <= MAX_PAGE_ROWS:
            raise ConfigError(f"migrate_page: start >= 0 and count in 1..{MAX_PAGE_ROWS}, got {start}, {count}")
        # Admission counters travel at the hand-off.
        page = table.page(start, count, keep=lambda ids: self.ownership.copying[self.ownership.partitions(ids)])
        return self._page_reply(page, total=table.num_rows)

    def handle_handoff_freeze(self, header: dict, arrays: list) -> Reply | Deferred:
        def freeze() -> Reply:
            self.ownership.freeze(header["partitions"])
            return Reply()
        switch = self.ownership.switch
        if switch is None:
            # Pulls admitted before the freeze and still waiting to be answered make their rows now
            # (not from inside a Deferred: the waiting list is not re-entrant).
            self.ctx.waiting.answer_ready()
            return freeze()
        # Sync: once every table completed the step before the switch; none of the step after
        # can be applied here (its requests are refused or route elsewhere).
        return Deferred(ready=lambda: all(t.version >= switch[0] for t in self.sparse.tables.values()),
                        make_reply=freeze, describe=lambda: f"tables to complete step {switch[0] - 1} before "
                                                            f"the hand-off",
                        waits_on=lambda: sorted({w for t in self.sparse.tables.values() for w in t.waiting_for()}))

    def handle_handoff_rows(self, header: dict, arrays: list) -> Reply:
        """The rows of the frozen partitions touched since the copy began (rows are only made
        during a move, and every one made is touched: the staged pages and these are all of
        them). After an eviction, which compacts rows under the pages, every row of the
        partitions, and their ids as ``current``."""
        parts = self.ownership.frozen(header["partitions"])
        table = self.sparse.table(header["table"])
        page = {}
        if table.evicted != self.evicted_at_start.get(table.name, table.evicted):
            ids = table.ids_by_row()
            in_group = np.zeros(len(self.ownership.owned), bool)
            in_group[parts] = True
            dirty = page["current"] = ids[in_group[self._partitions_by_row(table, ids)]]
        else:
            dirty = self.ownership.dirty_ids(table.name, parts)
        self.ownership.forget_dirty(table.name, parts)
        page.update(table.rows_of(dirty))
        mask = np.zeros(len(self.ownership.owned), bool)
        mask[parts] = True
        page.update(table.counters_of(lambda ids: mask[self.ownership.partitions(ids)]))
        reply = self._page_reply(page, total=len(page["ids"]))
        # The step the new owner starts at: in sync mode the switch's (this table may have gone
        # on with step S where the moving partitions are not touched), else this table's count.
        switch = self.ownership.switch
        reply.fields["version"] = switch[0] if switch is not None else table.version
        return reply

    def _partitions_by_row(self, table, ids: np.ndarray) -> np.ndarray:
        """The partition of each row, hashed once: rows are only appended during a move (an
        eviction, which compacts them, starts it again)."""
        evicted, known = self._row_partitions.get(table.name, (table.evicted, np.zeros(0, np.int64)))
        if evicted != table.evicted or len(known) > len(ids):
            known = np.zeros(0, np.int64)
        if len(known) < len(ids):
            known = np.concatenate([known, self.ownership.partitions(ids[len(known):])])
        self._row_partitions[table.name] = (table.evicted, known)
        return known

    def handle_migrate_finish(self, header: dict, arrays: list) -> Reply:
        """The move is over: the rows of partitions handed away go, a slice at a time between
        requests (``drop_some``, from the hook's tick), never all at once: no request waits on it.
        Until then they are never served: their partitions are refused before reaching a table."""
        lost = self.ownership.finish()
        tables = 0
        if lost.any():
            doomed = (lambda lost: lambda ids: lost[self.ownership.partitions(ids)])(lost.copy())
            for table in self.sparse.tables.values():
                table.drop_later(doomed)
                tables += 1
        self.intake.clear()
        self._row_partitions = {}
        return Reply({"dropped": 0, "dropping": tables})

    def drop_some(self, budget_s: float = DROP_BUDGET_S) -> int:
        """Slices of the drops under way, for about ``budget_s`` (at least one slice); rows dropped."""
        began, dropped = time.perf_counter(), 0
        for table in self.sparse.tables.values():
            while table.dropping:
                dropped += table.drop_some()
                if time.perf_counter() - began >= budget_s:
                    return dropped
        return dropped

    def drop_strays(self) -> None:
        """Rows taken in for partitions no longer expected (an aborted or stalled move) go, a
        slice at a time: they were never served, and never will be."""
        for name, parts in self.intake.strays(self.ownership.incoming).items():
            table = self.sparse.tables.get(name)
            if table is not None:
                doomed = np.zeros(len(self.ownership.owned), bool)
                doomed[parts] = True
                doomed &= ~self.ownership.owned
                table.drop_later(_in_partitions(doomed, self.ownership.partitions))

    def _page_reply(self, page: dict, total: int) -> Reply:
        names = list(page)
        out = [np.ascontiguousarray(page[n]) for n in names]
        out = [a.astype(np.int64) if a.dtype.kind in "iu" and a.dtype != np.uint64 else a for a in out]
        return Reply({"parts": names, "total": total}, out)

    # -- the new owner -------------------------------------------------------
    def handle_migrate_expect(self, header: dict, arrays: list) -> Reply | Deferred:
        if self._strays_unknown:
            not_owned = ~self.ownership.owned
            for table in self.sparse.tables.values():
                table.drop_later(_in_partitions(not_owned, self.ownership.partitions))
            self._strays_unknown = False
        # Rows of these partitions from an earlier stay here go first (a slice a tick: the move waits).
        return self._after_drops(lambda: self._expect(header), "migrate_expect")

    def _expect(self, header: dict) -> Reply:
        self.ownership.expect(header["partitions"])
        return Reply()

    def handle_migrate_stage(self, header: dict, arrays: list) -> Reply:
        table = self.sparse.table(header["table"])
        self.intake.stage(table, checked_page(table, header["parts"], arrays), self.ownership.incoming)
        return Reply()

    def handle_handoff_in(self, header: dict, arrays: list) -> Reply:
        table = self.sparse.table(header["table"])
        self.intake.hand_in(table, checked_page(table, header["parts"], arrays), header.get("version", 0))
        return Reply()

    def handle_handoff_done(self, header: dict, arrays: list) -> Reply:
        parts = np.asarray(header["partitions"], np.int64)
        if not self.ownership.incoming[self.ownership._check(parts, "handoff_done")].all():
            raise ConfigError(f"handoff_done: server {self.ctx.server_id} was not expecting all of these partitions")
        self.intake.adopt(self.sparse.tables, parts, len(self.ownership.owned))
        self.ctx.resubmit(self.ownership.adopt(parts))
        return Reply()

    def _late_push(self, table: str, ids: np.ndarray) -> None:
        """A sync push that waited for the step before it (sparse_service._early_push) was
        applied after the admission hook saw it: its rows change now, maybe during a copy."""
        if self.ownership.elastic:
            self.ownership.note_applied(table, ids)

    # -- an aborted move (placement/move_plan.py) ----------------------------------
    def handle_migrate_abort(self, header: dict, arrays: list) -> Reply:
        """The new owner's side: stop expecting these partitions and blocks (their staged rows
        go); the reply says which of them are served here (handed off before the abort)."""
        owned, held = self.ownership.abort_incoming(header["partitions"])
        self.intake.forget()
        self.drop_strays()
        blocks = self.dense_moves.abort_incoming(header["names"]) if self.dense_moves is not None else []
        self.ctx.resubmit(held)          # admitted again: refused as moved, or held for what is still coming
        return Reply({"owned": owned.tolist(), "blocks": blocks})

    def handle_handoff_undo(self, header: dict, arrays: list) -> Reply:
        """The old owner's side: serve again the frozen partitions and blocks that no new owner took."""
        back = self.ownership.undo_freeze(header["partitions"])
        blocks = self.dense_moves.undo_freeze(header["names"]) if self.dense_moves is not None else []
        return Reply({"restored": back.tolist(), "blocks": blocks})

    def handle_retire(self, header: dict, arrays: list) -> Reply:
        """A server a scale removed: it must serve nothing. With ``exit``: no trainer needs it any
        more (launch/elastic/elastic_servers.py checked): it stops once this reply is out (exit code 0)."""
        if self.ctx.server_id == 0:
            raise ConfigError("retire: server 0 holds the job's routing and services: it never retires")
        if self.ownership.owned.any() or self.ownership.incoming.any():
            raise ConfigError(f"retire: server {self.ctx.server_id} still serves partitions; move them first")
        self.ctx.retired = True
        if header.get("exit") is True:
            self.ctx.stop_after_replies()
        return Reply({"retired": True})


def attach_migration(server, env: ClusterEnv, sparse: SparseService) -> MigrationService:
    """Every server of a job can hand partitions on; with PARAMSHARD_PARTITIONS=0 it refuses to."""
    service = MigrationService(server.context, sparse, Routing.initial(env.partitions, env.servers))
    if env.partitions:
        service.on_addresses = server.follow_peers
    server.add_service(service)
    from paramshard.server.elastic.dense_migration import attach_dense_migration
    service.dense_moves = attach_dense_migration(server, service)      # dense blocks move with the partitions
    return service


def _in_partitions(mask: np.ndarray,
                   partitions: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    """ids -> whether each one's partition is set in ``mask`` (this mask, taken now; the partition
    of an id as the routing says when it is asked)."""
    return lambda ids: mask[partitions(ids)]


if TYPE_CHECKING:   # `make typecheck` checks the contract: Service (server/core/api.py), RequestHook (server/core/hooks.py)
    from paramshard.server.core.api import Service
    from paramshard.server.core.hooks import RequestHook
    _service: type[Service] = MigrationService
    _request_hook: type[RequestHook] = MigrationHook

