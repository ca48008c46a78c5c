"""A move of sparse partitions and dense blocks between servers, as a pure state machine.

No socket, no clock of its own, no sleep: like etcd's raft package, the machine says what to
send (``ready()``: a ``Ready`` of typed ``Step``s, each one wire request to one server) and is
fed what came back (``feed``: the replies; ``fail``: a step that was refused, timed out or
lost its server). A runner (client/move_runner.py) does the sending. The wire ops and their
order are those of docs/DESIGN.md section 5f (server/elastic/migration_service.py,
server/elastic/dense_migration.py):

1. ``routing_get`` (server 0), ``dense_held`` (every holder), ``migrate_tables``;
2. ``migrate_start`` (old owners: track), joiners ``routing_set join`` + ``migrate_tables_in``,
   ``migrate_expect`` / ``dense_expect`` (new owners: hold requests for what comes);
3. ``migrate_page`` -> ``migrate_stage``: the background copy, page by page;
4. sync mode: ``migrate_switch`` armed on every server (a "too close" refusal: a later step);
5. ``exclude_begin`` who=move on server 0: the hand-off phase takes its turn with checkpoints
   (server/elastic/move_exclusion.py; sync: once server 0 completed the step before the switch,
   ``after_step``); a "timeout" refusal (a checkpoint outlasting the server's timeout) is asked
   again until ``turn_patience`` seconds passed;
   per group: ``routing_set`` on server 0 (names the new owners; the first also the blocks'),
   the blocks' ``dense_freeze`` / ``dense_export`` -> ``dense_import``, then per old owner
   ``handoff_freeze``, ``handoff_rows`` -> ``handoff_in`` per table, ``handoff_done``;
6. the final routing on every server, ``exclude_end`` (checkpoints may run again: they read
   the final routing), then ``migrate_finish`` / ``dense_finish`` (old owners drop what they
   handed away; one holds its drop while a checkpoint pages its rows: server/storage/snapshot_reads.py),
   ``retire`` to a removed server.

A step that fails before the last hand-off is done aborts the move cleanly (``_abort``): the
new owners stop expecting (``migrate_abort``: it says which of the partitions and blocks in
doubt they took), the old owners take back what they froze and nobody took
(``handoff_undo``), server 0 publishes a newer routing naming the owners that serve now (groups
handed off stay handed off: their rows are on the new owner, exactly once) and the old owners
finish; server 0 ends the move's turn (``exclude_end``: a checkpoint waiting for it would
wait for ever otherwise). The job goes on under that routing; ``MoveFailed`` names the server and the step. A
partition whose ``handoff_done`` was sent but never answered, on a new owner that does not
answer ``migrate_abort`` either, is in doubt: it stays frozen on its old owner (taking it back
could serve it twice) and the error says so.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Generator, Sequence, TypeVar

import numpy as np

from paramshard.errors import ConfigError, RemoteError
from paramshard.placement.block_map import rebalance_blocks
from paramshard.placement.move_steps import MoveFailed, MoveRecord, Ready, Replies, Step, StepFailed
from paramshard.placement.partitions import Routing, partition_of, rebalance

__all__ = ["MovePlan", "MoveRecord", "Step", "Ready", "StepFailed", "MoveFailed", "PAGE_ROWS"]

PAGE_ROWS = 65536
SWITCH_TRIES = 20
TURN_PATIENCE = 600.0     # seconds a move asks again for its turn (a large table's checkpoint outlasts a timeout)

T = TypeVar("T")
# The move's coroutines: each yields (phase, steps to send now), is sent the replies (one
# (header, arrays) per step, in order; a failed step is thrown in as StepFailed) and returns a T.
Machine = Generator[tuple[str, list[Step]], Replies, T]


@dataclasses.dataclass
class _Progress:
    """What the move did so far, for an abort: every step *sent*, answered or not (a step that
    timed out may still have been applied)."""
    copying: set = dataclasses.field(default_factory=set)            # old owners sent migrate_start
    expecting: dict = dataclasses.field(default_factory=dict)        # new owner -> partitions expected
    dense_expecting: dict = dataclasses.field(default_factory=dict)  # new owner -> block names
    frozen: dict = dataclasses.field(default_factory=dict)           # old owner -> partitions frozen
    dense_frozen: dict = dataclasses.field(default_factory=dict)     # old owner -> block names frozen
    done_sent: dict = dataclasses.field(default_factory=dict)        # partition -> new owner: handoff_done sent
    adopted: set = dataclasses.field(default_factory=set)            # partitions handoff_done answered
    import_sent: dict = dataclasses.field(default_factory=dict)      # block -> new owner: dense_import sent
    imported: set = dataclasses.field(default_factory=set)           # blocks dense_import answered
    published: Routing | None = None                                  # the last routing_set sent to server 0
    armed: int | None = None           # sync: the routing version a migrate_switch was sent for
    joined: list = dataclasses.field(default_factory=list)            # servers sent routing_set join
    turn: bool = False                 # exclude_begin sent to server 0 (maybe granted): exclude_end is owed


class MovePlan:
    """Give the job's partitions (and dense blocks) to ``servers`` (indices into ``addresses``,
    every server the job ever had). Drive it: ``while (r := plan.ready()): ... plan.feed(...)``;
    then ``plan.result()`` is the MoveRecord or raises MoveFailed / ConfigError."""

    def __init__(self, addresses: Sequence[str], servers: Sequence[int], per_handoff: int = 16,
                 page_rows: int = PAGE_ROWS, switch_margin: int = 3, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic, turn_patience: float = TURN_PATIENCE):
        self.addresses, self.servers = list(addresses), sorted(int(s) for s in servers)
        self.per_handoff, self.page_rows, self.switch_margin = per_handoff, page_rows, switch_margin
        self.clock, self.monotonic, self.turn_patience = clock, monotonic, turn_patience
        self.record = MoveRecord([], self.servers, started=clock())      # filled in once the routing is read
        self.progress = _Progress()
        self._error: Exception | None = None
        self._ready: Ready | None = None
        self._count = 0
        self._machine = self._run()
        self._advance(lambda: next(self._machine))

    # -- the driver's side ------------------------------------------------------
    def ready(self) -> Ready | None:
        """The steps to send now; None once the move is over (see ``result``)."""
        return self._ready

    def feed(self, number: int, replies: Replies) -> None:
        """The replies to Ready ``number``, one per step in order. A reply to an older Ready (late:
        its steps were given up) is ignored."""
        if self._ready is None or number != self._ready.number:
            return
        if len(replies) != len(self._ready.steps):
            raise ValueError(f"Ready {number} has {len(self._ready.steps)} steps, {len(replies)} replies fed")
        self._advance(lambda: self._machine.send(list(replies)))

    def fail(self, number: int, index: int, cause: Exception | str) -> None:
        """Step ``index`` of Ready ``number`` failed (refused, deadline, server lost)."""
        if self._ready is None or number != self._ready.number:
            return
        step = self._ready.steps[index]
        self._advance(lambda: self._machine.throw(StepFailed(step, cause)))

    @property
    def done(self) -> bool:
        return self._ready is None

    def result(self) -> MoveRecord:
        if self._ready is not None:
            raise RuntimeError("the move is still under way: send its Ready steps first")
        if self._error is not None:
            raise self._error
        return self.record

    def _advance(self, resume: Callable) -> None:
        try:
            phase, steps = resume()
        except StopIteration:
            self._ready = None
            return
        except StepFailed as exc:      # before anything changed: nothing to undo
            self._ready = None
            self._error = MoveFailed(f"the move to servers {self.servers} did not start: {exc.step} did not "
                                     f"succeed ({exc.cause}); nothing was changed. Fix the server named, then "
                                     f"scale again", exc.step, self.record, undone=True)
            return
        except (MoveFailed, ConfigError) as exc:
            self._ready, self._error = None, exc
            return
        self._count += 1
        self._ready = Ready(self._count, phase, tuple(steps))

    # -- the move -----------------------------------------------------------------
    def _run(self) -> Machine[None]:
        (header, _), = yield "plan", [Step(0, {"op": "routing_get"})]
        routing = Routing.from_wire(header["routing"])
        servers, n = self.servers, len(self.addresses)
        if not set(servers) <= set(range(n)):
            raise ConfigError(f"servers {servers}: each must be an index into the {n} addresses")
        if not routing.elastic:
            raise ConfigError("this job routes sparse ids by a fixed hash (PARAMSHARD_PARTITIONS=0): its servers "
                              "cannot change; start it with PARAMSHARD_PARTITIONS=1024 to scale it")
        if 0 not in servers:
            raise ConfigError("server 0 holds the job's routing and services: it cannot be removed")
        revived = [s for s in servers if s < len(routing.addresses) and not routing.addresses[s]]
        if revived:
            # Trainers, peers and the replica keeper let go of a removed server for good (its
            # index stays a placeholder): a server added again is a new index, as the launcher does.
            raise ConfigError(f"servers {revived} were removed by an earlier scale: an added server takes a "
                              f"new index (the next is {len(routing.addresses)}), never a removed one's")
        before = routing.servers()
        record = self.record = MoveRecord(before, list(servers), started=self.clock())
        address_list = list(routing.addresses) + self.addresses[len(routing.addresses):]
        for s in servers:
            address_list[s] = self.addresses[s]
        owners = rebalance(routing.owners, servers)
        moving = np.flatnonzero(owners != routing.owners)
        record.partitions = len(moving)
        blocks_now, new_blocks = yield from self._block_maps(routing, before)
        dense_moves = {b: (blocks_now[b], s) for b, s in new_blocks.items() if s != blocks_now[b]}
        record.blocks = len(dense_moves)
        joined = [s for s in servers if s not in before]
        routing = routing.moved_to(routing.owners, version=routing.version, addresses=address_list, blocks=blocks_now)
        (described, _), = yield "plan", [Step(0, {"op": "migrate_tables"})]
        tables, sync = described["tables"], described["sync"]
        names = [t["table"] for t in tables]
        work = _Work(routing, owners, moving, names, dense_moves, new_blocks, address_list)
        try:
            yield from self._prepare(work, joined, tables)
            began = self.monotonic()
            yield from self._copy(work)
            record.copy_s = self.monotonic() - began
            per_handoff = self.per_handoff
            if sync and (len(moving) or dense_moves):
                # Sync: every trainer changes routing at one step S; all partitions are handed off
                # between the completion of step S - 1 and any push of step S (handoff_freeze waits).
                record.switch_step, record.arm_tries = yield from self._arm(sorted(set(servers) | set(before)),
                                                                            routing.version + 1)
                per_handoff = max(1, len(moving))
            groups = [moving[i:i + per_handoff] for i in range(0, len(moving), per_handoff)]
            if dense_moves and not groups:
                groups = [moving[:0]]
            # From the first hand-off to the final routing, checkpoints wait (and this waits for one
            # in progress): a checkpoint reads the routing before the hand-offs or the final one,
            # never rows half handed over. Nothing in the turn waits for a trainer's next step.
            yield from self._take_turn(record.switch_step)
            for number, group in enumerate(groups):
                began = self.monotonic()
                yield from self._hand_off(work, group, dense=number == 0 and bool(dense_moves))
                took = self.monotonic() - began
                record.handoffs += 1
                record.longest_handoff_s = max(record.longest_handoff_s, took)
                record.handoffs_s += took
        except StepFailed as failed:
            yield from self._abort(work, failed, before)
        # Every partition and block is on its new owner: what is left cannot be undone, only finished.
        unanswered: list[str] = []
        try:
            yield from self._finish(work, before, unanswered)
        except StepFailed as failed:
            turn = ("; checkpoints wait until server 0 ends the move's turn: restart server 0 or roll the job back"
                    if failed.step.op == "exclude_end" else "")
            raise MoveFailed(f"the move to servers {servers} is done (routing version {work.routing.version} "
                             f"names every new owner) but finishing it failed: {failed.step} did not succeed "
                             f"({failed.cause}); the old owners may still hold rows they handed away{turn}"
                             + "".join(f"; {u}" for u in unanswered),
                             failed.step, record, undone=False, moved=True, unanswered=unanswered) from None
        record.ended = self.clock()

    def _take_turn(self, after_step: int | None) -> Machine[None]:
        """``exclude_begin`` who=move on server 0 (server/elastic/move_exclusion.py): granted once no
        checkpoint is in progress (sync: and server 0 completed step ``after_step - 1``). Server 0
        refuses it as "timeout" when that took longer than its timeout: asked again until
        ``turn_patience`` seconds passed, then the move aborts naming who held the turn."""
        header: dict[str, Any] = {"op": "exclude_begin", "who": "move"}
        if after_step is not None:
            header["after_step"] = after_step
        deadline = self.monotonic() + self.turn_patience
        while True:
            self.progress.turn = True          # sent: a late grant holds the turn too
            try:
                yield "turn", [Step(0, header)]
                return
            except StepFailed as failed:
                if not _timed_out(failed.cause) or self.monotonic() >= deadline:
                    raise

    def _block_maps(self, routing: Routing, before: list[int]) -> Machine[tuple[dict, dict]]:
        """(where each dense block is now, where it goes). Before the first move the routing has
        no block map: the servers say what they hold (the plan's placement)."""
        holders = sorted(set(before) | set(routing.blocks.values()))
        replies = yield "plan", [Step(s, {"op": "dense_held"}) for s in holders]
        now, sizes = dict(routing.blocks), {}
        for s, (header, _) in zip(holders, replies):
            sizes.update(header["blocks"])
            if not routing.blocks:
                now.update(dict.fromkeys(header["blocks"], s))
        if set(now) != set(sizes):
            raise ConfigError(f"dense blocks {sorted(set(now) ^ set(sizes))[:3]} are not where the routing "
                              f"(version {routing.version}) says; is a move still under way?")
        if not now:
            return {}, {}
        return now, rebalance_blocks(now, sizes, self.servers)

    def _prepare(self, w: "_Work", joined: list[int], tables: list[dict]) -> Machine[None]:
        """Old owners track, joiners get the routing and the tables, new owners expect."""
        p, routing, owners, moving = self.progress, w.routing, w.owners, w.moving
        coming = {dest: dict.fromkeys(w.tables, 0.0) for dest in joined}      # rows, roughly
        for s in sorted(set(routing.owners[moving].tolist())):
            p.copying.add(s)
            (held, _), = yield "prepare", [Step(s, {"op": "migrate_start",
                                                    "partitions": _ints(moving[routing.owners[moving] == s])})]
            for dest in joined:
                share = int(((routing.owners == s) & (owners == dest)).sum()) / max(1, int((routing.owners == s).sum()))
                for table, rows in held["rows"].items():
                    coming[dest][table] = coming[dest].get(table, 0.0) + rows * share
        for s in joined:    # before any request can reach it: it owns nothing, has the tables, room for the rows
            p.joined.append(s)
            yield "prepare", [Step(s, {"op": "routing_set", "routing": routing.to_wire(), "join": True})]
            yield "prepare", [Step(s, {"op": "migrate_tables_in", "tables": [
                {**t, "reserve": int(coming[s].get(t["table"], 0) * 1.05)} for t in tables]})]
        for s in sorted(set(owners[moving].tolist())):
            mine = moving[owners[moving] == s]
            p.expecting[s] = set(mine.tolist())
            yield "prepare", [Step(s, {"op": "migrate_expect", "partitions": _ints(mine)})]
        for s in sorted({dest for _, dest in w.dense_moves.values()}):
            mine = sorted(b for b, (_, d) in w.dense_moves.items() if d == s)
            p.dense_expecting[s] = set(mine)
            yield "prepare", [Step(s, {"op": "dense_expect", "names": mine})]

    def _copy(self, w: "_Work") -> Machine[None]:
        """Every moving partition's rows, page by page, from its owner to its new one (rows there
        at once, served from the hand-off on). Pipelined: each round asks every source for its
        next page and gives the new owners the pages the round before brought, so sources page
        and new owners take pages in at the same time (one round trip a page, not two, and the
        sources side by side)."""
        work = {source: [[table, 0] for table in w.tables]
                for source in sorted(set(w.routing.owners[w.moving].tolist())) if w.tables}   # dense only: none
        brought: list[tuple[str, list, list]] = []          # (table, parts, arrays) of the last round
        while work or brought:
            asks = [(source, *todo[0]) for source, todo in work.items()]
            steps = [Step(source, {"op": "migrate_page", "table": table, "start": start, "count": self.page_rows})
                     for source, table, start in asks]
            for table, parts, arrays in brought:
                steps.extend(self._split(w, "migrate_stage", table, parts, arrays))
            if not steps:
                break
            replies = yield "copy", steps
            brought = []
            for (source, table, start), (header, arrays) in zip(asks, replies):
                brought.append((table, header["parts"], arrays))
                todo = work[source]
                todo[0][1] = start + self.page_rows
                if todo[0][1] >= header["total"]:
                    todo.pop(0)
                    if not todo:
                        del work[source]

    def _forward(self, w: "_Work", op: str, table: str, parts: list, arrays: list, to: int | None = None,
                 **fields) -> Machine[None]:
        """A page's rows to the servers their partitions go to (or all of it to ``to``)."""
        steps = self._split(w, op, table, parts, arrays, to, **fields)
        if steps:
            yield ("handoff" if to is not None else "copy"), steps

    def _split(self, w: "_Work", op: str, table: str, parts: list, arrays: list, to: int | None = None,
               **fields) -> list[Step]:
        """The steps that give a page's rows to the servers their partitions go to (or all of it to
        ``to``), one per server; counted in the record."""
        named = dict(zip(parts, arrays))
        self.record.bytes += sum(a.nbytes for a in arrays)
        if to is not None:
            return [Step(to, {"op": op, "table": table, "parts": list(parts), **fields}, tuple(arrays))]
        if not len(named["ids"]):
            return []
        self.record.rows += len(named["ids"])
        dest = w.owners[partition_of(named["ids"], w.routing.partitions)]
        return [Step(s, {"op": op, "table": table, "parts": list(parts)}, tuple(named[k][dest == s] for k in parts))
                for s in np.unique(dest).tolist()]

    def _arm(self, servers: list[int], version: int) -> Machine[tuple[int, int]]:
        """Sync: the step at which routing ``version`` takes over, armed on every server: ``margin``
        steps past the furthest table, later if a server says it is too close by then."""
        margin = self.switch_margin
        for attempt in range(1, SWITCH_TRIES + 1):
            replies = yield "arm", [Step(s, {"op": "migrate_tables"}) for s in servers]
            step = max(t["version"] for header, _ in replies for t in header["tables"]) + margin
            self.progress.armed = version
            try:
                for s in servers:
                    yield "arm", [Step(s, {"op": "migrate_switch", "step": step, "version": version})]
                return step, attempt
            except StepFailed as failed:
                if "too close" not in str(failed.cause):
                    raise
                margin += 2
        raise StepFailed(Step(servers[0], {"op": "migrate_switch"}),
                         f"sync mode: no step to change routing at was found in {SWITCH_TRIES} tries")

    def _hand_off(self, w: "_Work", group: np.ndarray, dense: bool) -> Machine[None]:
        """Publish ``group`` at its new owners (server 0 first), then freeze, hand over and adopt it.
        ``dense``: the blocks' new map is published and they move with this group."""
        p, record = self.progress, self.record
        new_owners = w.routing.owners.copy()
        new_owners[group] = w.owners[group]
        published = w.routing.moved_to(new_owners, blocks=w.new_blocks if dense else None)
        p.published = published
        yield "handoff", [Step(0, {"op": "routing_set", "routing": published.to_wire()})]
        if dense:
            yield from self._hand_off_blocks(w)
        for source in sorted(set(w.routing.owners[group].tolist())):
            mine = group[w.routing.owners[group] == source]
            p.frozen.setdefault(source, set()).update(mine.tolist())
            yield "handoff", [Step(source, {"op": "handoff_freeze", "partitions": _ints(mine)})]
            for dest in sorted(set(w.owners[mine].tolist())):
                theirs = mine[w.owners[mine] == dest]
                for table in w.tables:
                    (header, arrays), = yield "handoff", [Step(source, {"op": "handoff_rows", "table": table,
                                                                        "partitions": _ints(theirs)})]
                    record.rows += len(arrays[header["parts"].index("ids")])
                    yield from self._forward(w, "handoff_in", table, header["parts"], arrays, to=dest,
                                             version=header["version"])
                p.done_sent.update(dict.fromkeys(theirs.tolist(), dest))
                yield "handoff", [Step(dest, {"op": "handoff_done", "partitions": _ints(theirs)})]
                p.adopted.update(theirs.tolist())
        w.routing = published

    def _hand_off_blocks(self, w: "_Work") -> Machine[None]:
        """Freeze each moving block on its old owner, export it whole and import it on the new one."""
        p, moves = self.progress, w.dense_moves
        for source in sorted({src for src, _ in moves.values()}):
            mine = sorted(b for b, (src, _) in moves.items() if src == source)
            p.dense_frozen.setdefault(source, set()).update(mine)
            yield "handoff", [Step(source, {"op": "dense_freeze", "names": mine})]
            for dest in sorted({moves[b][1] for b in mine}):
                names = [b for b in mine if moves[b][1] == dest]
                (header, arrays), = yield "handoff", [Step(source, {"op": "dense_export", "names": names})]
                fields = {k: header[k] for k in ("names", "versions", "slots", "optimizer", "plan_fingerprint")}
                if "clocks" in header:       # async: the staleness clocks go with the blocks (dense_store)
                    fields["clocks"] = header["clocks"]
                p.import_sent.update(dict.fromkeys(names, dest))
                yield "handoff", [Step(dest, {"op": "dense_import", **fields, "lr_scale": float(header["lr_scale"])},
                                       tuple(arrays))]
                p.imported.update(names)
                size = sum(a.nbytes for a in arrays)
                self.record.bytes += size
                self.record.dense_bytes += size

    def _finish(self, w: "_Work", before: list[int], unanswered: list) -> Machine[None]:
        record, servers = self.record, self.servers
        routing = w.routing
        if len(w.moving) == 0 and routing.addresses != tuple(w.address_list):
            routing = routing.moved_to(routing.owners, addresses=w.address_list)
        final = routing.moved_to(w.owners, addresses=[a if i in servers else "" for i, a in enumerate(w.address_list)],
                                 blocks=w.new_blocks)
        # The servers the move removes take the final routing first: a trainer learns it from server 0
        # and then closes its link to a removed server, which must know by then that it is retired
        # (a closed link is a leave there, not a loss that fails it with a grace period: CI, stop 40).
        removed = sorted(set(before) - set(servers))
        try:
            for wave in (removed, [s for s in sorted(set(servers) | set(before)) if s not in removed]):
                if wave:
                    yield "finish", [Step(s, {"op": "routing_set", "routing": final.to_wire()}) for s in wave]
        except StepFailed:
            yield from self._end_turn(best_effort=True, noted=unanswered)     # the move failed: checkpoints may go on
            raise
        # The hand-off phase is over: checkpoints read the final routing from now on. Old owners
        # drop what they handed away only after it (a checkpoint keeps only the owners' rows).
        yield from self._end_turn()
        began = self.monotonic()
        # A removed server owns nothing from the final routing on: what it is sent now (drop what it
        # handed away, retire) is tidying, not the move. It may already have stopped by itself (its
        # trainers gone: some left, the others let go of it on the final routing), so a step it does
        # not answer is noted (record.unfinished), not a failed move; the launcher stops it if not.
        yield "finish", [Step(s, {"op": "migrate_finish"}) for s in before if s in servers]
        dense_sources = sorted({src for src, _ in w.dense_moves.values()})
        if any(s in servers for s in dense_sources):
            yield "finish", [Step(s, {"op": "dense_finish"}) for s in dense_sources if s in servers]
        retired = [s for s in before if s not in servers]
        for s in retired:
            yield from self._tidy(Step(s, {"op": "migrate_finish"}))
            if s in dense_sources:
                yield from self._tidy(Step(s, {"op": "dense_finish"}))
        record.finish_s = self.monotonic() - began
        for s in retired:
            yield from self._tidy(Step(s, {"op": "retire"}))
        record.routing_version = final.version

    def _tidy(self, step: Step) -> Machine[None]:
        """Send ``step`` to a removed server; a failure is noted in the record, the move goes on."""
        try:
            yield "finish", [step]
        except StepFailed as failed:
            self.record.unfinished.append(f"{failed.step} ({failed.cause})")

    def _end_turn(self, best_effort: bool = False, noted: list | None = None) -> Machine[None]:
        """``exclude_end`` who=move on server 0, if the move asked for its turn. A failure raises
        (StepFailed), or with ``best_effort`` is only noted in ``noted``: a move that failed
        already must not fail again on the way out."""
        if not self.progress.turn:
            return
        self.progress.turn = False
        try:
            yield "turn", [Step(0, {"op": "exclude_end", "who": "move"})]
        except StepFailed as again:
            if not best_effort:
                raise
            if noted is not None:
                noted.append(f"{again.step} ({again.cause}: checkpoints wait until server 0 ends the move's "
                             f"turn; restart server 0 or roll the job back)")

    # -- a clean abort ----------------------------------------------------------------
    def _abort(self, w: "_Work", failed: StepFailed, before: list[int]) -> Machine[None]:
        """Undo what can be undone, each undo step best effort (its own failure is noted, not
        raised), then raise MoveFailed naming the failed step."""
        p, record = self.progress, self.record
        unanswered: list[str] = []

        def attempt(phase, step):
            """One undo step: its reply, or None (noted) when it fails too."""
            try:
                (reply, _), = yield phase, [step]
                return reply
            except StepFailed as again:
                unanswered.append(f"{again.step} ({again.cause})")
                return None

        # 1. New owners stop expecting; they say which partitions/blocks in doubt they serve.
        took, took_blocks, in_doubt, blocks_in_doubt = set(), set(), set(), set()
        for dest in sorted(set(p.expecting) | set(p.dense_expecting)):
            parts = sorted(p.expecting.get(dest, set()) - p.adopted)
            names = sorted(p.dense_expecting.get(dest, set()) - p.imported)
            reply = yield from attempt("abort", Step(dest, {"op": "migrate_abort", "partitions": parts,
                                                            "names": names}))
            doubtful = {q for q in parts if p.done_sent.get(q) == dest}
            doubtful_blocks = {b for b in names if p.import_sent.get(b) == dest}
            if reply is None:
                in_doubt |= doubtful
                blocks_in_doubt |= doubtful_blocks
                took_blocks |= doubtful_blocks      # not taken back: the new owner may serve them
            else:
                took |= doubtful & set(reply["owned"])
                took_blocks |= doubtful_blocks & set(reply["blocks"])
        served_new = p.adopted | took | in_doubt          # partitions the new owners (may) serve
        stuck: set = set()                                 # frozen on an old owner that did not take them back
        blocks_new = p.imported | took_blocks
        # 2. Old owners take back what they froze and no new owner took.
        for source in sorted(set(p.frozen) | set(p.dense_frozen)):
            parts = sorted(p.frozen.get(source, set()) - served_new)
            names = sorted(p.dense_frozen.get(source, set()) - blocks_new)
            if parts or names:
                reply = yield from attempt("abort", Step(source, {"op": "handoff_undo", "partitions": parts,
                                                                  "names": names}))
                if reply is None:
                    stuck |= set(parts)
                    blocks_in_doubt |= set(names)
        # 3. Server 0 names who serves now: the old owners, but for what was handed off.
        owners = w.routing.owners.copy()        # the routing before the group that failed
        back = np.asarray(sorted(served_new), np.int64)
        owners[back] = w.owners[back]
        blocks = {b: (w.new_blocks[b] if b in blocks_new else w.dense_moves[b][0] if b in w.dense_moves else s)
                  for b, s in (w.routing.blocks or {}).items()}
        # Sync: a switch armed for version V refuses requests of its step that carry an older
        # routing, so the restored one is at least V even when nothing was published yet.
        newest = max(w.routing.version, p.published.version if p.published is not None else 0,
                     p.armed - 1 if p.armed is not None else 0)
        restored = w.routing.moved_to(owners, version=newest + 1, blocks=blocks)
        published = False
        if p.published is not None or p.armed is not None:   # (other servers' routing counts once the move ends)
            published = (yield from attempt("abort", Step(0, {"op": "routing_set",
                                                              "routing": restored.to_wire()}))) is not None
        # The hand-off phase is over (the routing above names who serves): checkpoints may run.
        yield from self._end_turn(best_effort=True, noted=unanswered)
        # 4. Old owners stop tracking and drop only what was handed off.
        for s in sorted(p.copying):
            yield from attempt("abort", Step(s, {"op": "migrate_finish"}))
        for s in sorted(src for src in p.dense_frozen if p.dense_frozen[src] & blocks_new):
            yield from attempt("abort", Step(s, {"op": "dense_finish"}))
        record.ended = self.clock()
        record.routing_version = restored.version if published else (
            p.published.version if p.published is not None else w.routing.version)
        handed = len(p.adopted | took)
        message = (f"the move to servers {self.servers} was aborted: {failed.step} did not succeed ({failed.cause}). "
                   f"{handed} of {len(w.moving)} partitions had been handed off and stay with their new owners; "
                   f"the rest are served by their old owners again")
        if published:
            message += f" (routing version {restored.version} on server 0)"
        if in_doubt:
            message += (f"; partitions {sorted(in_doubt)[:8]} are in doubt (their hand-off was sent but never "
                        f"confirmed): they stay frozen on the old owner; check the new owner's log")
        if stuck:
            message += (f"; partitions {sorted(stuck)[:8]} stay frozen on their old owner (it did not take them "
                        f"back)")
        if blocks_in_doubt:
            message += f"; dense blocks {sorted(blocks_in_doubt)[:4]} may be served by nobody"
        if unanswered:
            message += "; undo steps that failed too: " + "; ".join(unanswered[:4])
        message += ". Fix the server named, then scale again"
        # Clean: every partition is served by one server and server 0 names it (an undo step that
        # only tidies, e.g. migrate_abort on a new owner with nothing in doubt, may fail).
        clean = not in_doubt and not stuck and not blocks_in_doubt and (
            published or (p.published is None and p.armed is None))
        raise MoveFailed(message, failed.step, record, undone=clean, in_doubt=sorted(in_doubt | stuck),
                         unanswered=unanswered)


@dataclasses.dataclass
class _Work:
    routing: Routing              # as published last (the routing before the next group)
    owners: np.ndarray            # every partition's owner at the end
    moving: np.ndarray            # partitions that change owner
    tables: list[str]
    dense_moves: dict             # block -> (old owner, new owner)
    new_blocks: dict              # block -> owner at the end
    address_list: list[str]


def _timed_out(cause) -> bool:
    """A refusal as "timeout": the server gave up waiting (a Deferred), nothing was applied."""
    return isinstance(cause, RemoteError) and cause.code == "timeout"


def _ints(a) -> list[int]:
    return [int(x) for x in a]
