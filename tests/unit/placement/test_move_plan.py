"""placement/move_plan.py + client/move_runner.py: every interleaving of refusals, killed servers
and late replies ends in the move done or cleanly aborted, with every moving partition handed
off exactly once.

The servers are fakes that keep what the real ones keep about a move (server/elastic/partition_ownership.py,
server/elastic/dense_migration.py): which partitions each owns, expects, copies out, froze, which rows it
holds, which dense blocks; each op checks what the real handler checks and refuses the same
misuse. The links are fakes of ServerLinks' submit/collect: a step can be answered, refused (an
error reply, nothing applied), lost (no reply, nothing applied), late (applied, its reply past
the deadline) or kill its server (nothing applied, every later step to it fails too).
Oracles: no partition is ever served by two servers, none is adopted twice; a move that
succeeds leaves every partition (rows and all) on its target owner and nothing else anywhere;
a move that fails names the server and the op, and when it says it undid the move every
partition is served by exactly one server, the one server 0's routing names, and rows were
dropped only where they were handed off.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paramshard.client.move_runner import run_move
from paramshard.errors import ConfigError, DeadlineExceeded, RemoteError, ServerUnavailable
from paramshard.placement.move_plan import MoveFailed, MovePlan
from paramshard.placement.partitions import Routing, partition_of, rebalance
from paramshard.transport.links import Ticket

P = 16
BLOCKS = ["b0", "b1", "b2", "b3"]


def _one_id_per_partition() -> np.ndarray:
    """An id in each partition: partition p's rows are that one row."""
    ids, found = np.zeros(P, np.uint64), np.zeros(P, bool)
    candidate = np.arange(1, 4096, dtype=np.uint64)
    parts = partition_of(candidate, P)
    for p in range(P):
        ids[p] = candidate[np.flatnonzero(parts == p)[0]]
        found[p] = True
    return ids


IDS = _one_id_per_partition()


class FakeServer:
    def __init__(self, index: int, routing: Routing, joining: bool, sync: bool):
        self.index, self.routing, self.sync = index, routing, sync
        self.owned = set() if joining else set(np.flatnonzero(routing.owners == index).tolist())
        self.rows = set(self.owned)             # partitions whose rows are here
        self.incoming, self.copying, self.lost, self.staged = set(), set(), set(), set()
        self.blocks = set() if joining else {b for i, b in enumerate(BLOCKS) if i % 2 == index}
        self.gone, self.blocks_in = set(), set()
        self.adoptions: list[int] = []          # every handoff_done applied here, by partition
        self.switch = None
        self.turn = False                       # server 0: a move holds the turn (checkpoints wait)

    def handle(self, header: dict, arrays) -> tuple[dict, list]:
        op = header["op"]
        return getattr(self, f"op_{op}")(header, list(arrays))

    @staticmethod
    def _refuse(why: str):
        raise ConfigError(why)

    def op_routing_get(self, h, a):
        return {"routing": self.routing.to_wire()}, []

    def op_routing_set(self, h, a):
        routing = Routing.from_wire(h["routing"])
        if routing.version < self.routing.version:
            self._refuse(f"routing version {routing.version} is older than {self.routing.version}")
        if h.get("join") and self.owned:
            self._refuse("already serves partitions: cannot join")
        self.routing = routing
        return {"version": routing.version}, []

    def op_dense_held(self, h, a):
        return {"blocks": {b: 64 for b in self.blocks - self.gone}}, []

    def op_migrate_tables(self, h, a):
        return {"tables": [{"table": "emb", "version": 7}], "sync": self.sync}, []

    def op_migrate_tables_in(self, h, a):
        return {"tables": ["emb"]}, []

    def op_migrate_switch(self, h, a):
        self.switch = (h["step"], h["version"])
        return {}, []

    def op_migrate_start(self, h, a):
        parts = set(h["partitions"])
        if not parts <= self.owned:
            self._refuse("migrate_start: does not own all of these partitions")
        self.copying |= parts
        return {"rows": {"emb": len(self.rows)}}, []

    def op_migrate_expect(self, h, a):
        parts = set(h["partitions"])
        if parts & self.owned:
            self._refuse("migrate_expect: already owns some")
        self.incoming |= parts
        return {}, []

    def op_dense_expect(self, h, a):
        if set(h["names"]) & (self.blocks - self.gone):
            self._refuse("dense_expect: already holds some")
        self.blocks_in |= set(h["names"])
        return {}, []

    def op_migrate_page(self, h, a):
        rows = sorted(self.rows)
        page = [q for q in rows[h["start"]:h["start"] + h["count"]] if q in self.copying]
        return {"parts": ["ids", "values"], "total": len(rows)}, [IDS[page], np.zeros((len(page), 2), np.float32)]

    def op_migrate_stage(self, h, a):
        parts = set(partition_of(a[0], P).tolist())
        if not parts <= self.incoming:
            self._refuse("migrate_stage: rows of partitions this server does not expect")
        self.staged |= parts
        return {}, []

    def op_handoff_freeze(self, h, a):
        parts = set(h["partitions"])
        if not parts <= (self.owned & self.copying):
            self._refuse("handoff_freeze: not copying all of these out")
        self.owned -= parts
        self.lost |= parts
        return {}, []

    def op_handoff_rows(self, h, a):
        parts = sorted(h["partitions"])
        if not set(parts) <= self.lost:
            self._refuse("handoff_rows: freeze first")
        return {"parts": ["ids", "values"], "total": len(parts), "version": 7}, \
            [IDS[parts], np.zeros((len(parts), 2), np.float32)]

    def op_handoff_in(self, h, a):
        return {}, []

    def op_handoff_done(self, h, a):
        parts = set(h["partitions"])
        if not parts <= self.incoming:
            self._refuse("handoff_done: was not expecting all of these partitions")
        self.incoming -= parts
        self.owned |= parts
        self.rows |= parts
        self.adoptions += sorted(parts)
        return {}, []

    def op_dense_freeze(self, h, a):
        if not set(h["names"]) <= self.blocks:
            self._refuse("dense_freeze: unknown block")
        self.gone |= set(h["names"])
        return {}, []

    def op_dense_export(self, h, a):
        names = h["names"]
        if not set(names) <= self.gone:
            self._refuse("dense_export: freeze first")
        return ({"names": names, "versions": [0] * len(names), "slots": 0, "optimizer": {}, "plan_fingerprint": 1,
                 "lr_scale": 1.0}, [np.zeros(16, np.float32) for _ in names])

    def op_dense_import(self, h, a):
        names = set(h["names"])
        if not names <= self.blocks_in:
            self._refuse("dense_import: not expecting all of these blocks")
        self.blocks |= names
        self.gone -= names
        self.blocks_in -= names
        return {"blocks": len(names)}, []

    def op_migrate_finish(self, h, a):
        self.rows -= self.lost
        self.lost, self.copying = set(), set()
        self.staged = set()
        return {"dropped": 0}, []

    def op_dense_finish(self, h, a):
        self.blocks -= self.gone
        self.gone = set()
        return {}, []

    def op_retire(self, h, a):
        if self.owned or self.incoming:
            self._refuse("retire: still serves partitions")
        return {"retired": True}, []

    def op_exclude_begin(self, h, a):
        if self.index != 0:
            self._refuse("exclude_begin: server 0 keeps the turns")
        if self.turn:
            self._refuse("exclude_begin: a move holds the turn already")     # one move at a time
        self.turn = True
        return {}, []

    def op_exclude_end(self, h, a):
        self.turn = False
        return {}, []

    def op_migrate_abort(self, h, a):
        parts, names = set(h["partitions"]), set(h["names"])
        self.incoming -= parts
        self.staged -= parts
        self.blocks_in -= names
        return {"owned": sorted(parts & self.owned), "blocks": sorted(names & (self.blocks - self.gone))}, []

    def op_handoff_undo(self, h, a):
        back = set(h["partitions"]) & self.lost
        self.owned |= back
        self.lost -= back
        blocks = set(h["names"]) & self.gone
        self.gone -= blocks
        return {"restored": sorted(back), "blocks": sorted(blocks)}, []


class FakeLinks:
    """ServerLinks' submit/collect/discard over FakeServers, each step's fate drawn by ``fate``."""

    def __init__(self, servers: list[FakeServer], fate):
        self.servers, self.fate = servers, fate
        self.dead: set[int] = set()
        self.log: list[tuple[int, str, str]] = []      # (server, op, what happened)

    def __len__(self):
        return len(self.servers)

    def submit(self, requests, timeout=None):
        (server, header, arrays), = requests
        ticket = Ticket(1, 1.0, 0.0)
        what = "dead" if server in self.dead else self.fate()
        if what == "kill":
            self.dead.add(server)
        self.log.append((server, header["op"], what))
        name = f"server {server}"
        if what in ("dead", "kill"):
            error = ServerUnavailable(f"scaler lost its connection to {name}")
        elif what == "lost":
            error = DeadlineExceeded(f"scaler waited 1 s for {name} [{header['op']}, connected]")
        elif what == "refuse":
            error = RemoteError(name, "invalid", f"{header['op']}: refused (fault injected)")
        else:
            try:
                reply = self.servers[server].handle(header, arrays)
            except ConfigError as exc:
                error = RemoteError(name, "invalid", str(exc))
            else:
                error = None if what == "ok" else DeadlineExceeded(
                    f"scaler waited 1 s for {name} [{header['op']}, connected]")     # late: applied, no reply
                ticket.results[0] = reply
        ticket.error = error
        return ticket

    def collect(self, ticket):
        if ticket.error is not None:
            raise ticket.error
        return ticket.results

    def discard(self, ticket):
        pass


def _cluster(before: int, after: int, sync: bool):
    addresses = [f"127.0.0.1:{7000 + i}" for i in range(max(before, after))]
    routing = Routing.initial(P, addresses[:before])
    servers = [FakeServer(i, routing, joining=i >= before, sync=sync) for i in range(len(addresses))]
    return addresses, routing, servers


def _check_never_served_twice(servers: list[FakeServer]) -> None:
    served = [q for s in servers for q in s.owned]
    assert len(served) == len(set(served)), f"a partition served by two servers: {sorted(served)}"
    adopted = [q for s in servers for q in s.adoptions]
    assert len(adopted) == len(set(adopted)), f"a partition handed off twice: {sorted(adopted)}"
    held = [b for s in servers for b in s.blocks - s.gone]
    assert len(held) == len(set(held)), f"a dense block served by two servers: {sorted(held)}"


class CheckingLinks(FakeLinks):
    def submit(self, requests, timeout=None):
        ticket = super().submit(requests, timeout)
        _check_never_served_twice(self.servers)          # after every step, not only at the end
        return ticket


SCENARIOS = [(2, [0, 1, 2]), (3, [0, 1]), (3, [0, 2]), (2, [0, 1, 2, 3]), (4, [0, 3])]


FAULTS = st.sampled_from(["refuse", "lost", "late", "kill"])


@pytest.mark.slow_unit(reason="hypothesis explores fault interleavings")
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=st.sampled_from(SCENARIOS), per_handoff=st.sampled_from([1, 3, 16]),
       page_rows=st.sampled_from([2, 5, 64]), sync=st.booleans(),
       first=st.one_of(st.none(), st.tuples(st.integers(0, 160), FAULTS)),
       after_first=st.dictionaries(st.integers(1, 12), FAULTS, max_size=3))
def test_every_interleaving_of_faults_ends_done_or_cleanly_aborted(scenario, per_handoff, page_rows, sync, first,
                                                                    after_first):
    """The fate of the n-th step sent (every other step is answered): a first fault anywhere in
    the move (a move is 60-160 steps) or none, then a few within the next dozen steps, which are
    the abort's own when the first one aborted the move."""
    faults = {} if first is None else {first[0]: first[1], **{first[0] + k: f for k, f in after_first.items()}}
    before, after = scenario
    addresses, routing, servers = _cluster(before, max(after) + 1, sync)
    sent = iter(range(10**6))
    links = CheckingLinks(servers, lambda: faults.get(next(sent), "ok"))
    target = rebalance(routing.owners, after)
    moving = set(np.flatnonzero(target != routing.owners).tolist())
    plan = MovePlan(addresses, after, per_handoff=per_handoff, page_rows=page_rows)
    try:
        record = run_move(links, plan, timeout=1.0)
    except MoveFailed as failed:
        _check_aborted(failed, servers, links, routing, moving)
        return
    assert record.partitions == len(moving)
    # A removed server that did not answer its tidying (dead, or it stopped by itself) may keep rows
    # and blocks it handed away: it owns nothing and nobody routes to it. Only a removed one.
    untidy = {int(u.split(" on server ")[1].split()[0]) for u in record.unfinished}
    assert untidy <= set(range(len(servers))) - set(after), record.unfinished
    for q in range(P):
        holders = [s.index for s in servers if q in s.owned]
        assert holders == [int(target[q])], f"partition {q} is served by {holders}, its new owner is {target[q]}"
        assert [s.index for s in servers if q in s.rows and s.index not in untidy] == holders, \
            f"partition {q}: rows left behind"
    assert not any(s.incoming or s.copying or s.lost or s.blocks_in or s.gone for s in servers
                   if s.index not in untidy)
    final = servers[0].routing
    assert np.array_equal(final.owners, target) and final.version == record.routing_version
    assert sorted(b for s in servers for b in s.blocks - (s.gone if s.index in untidy else set())) == BLOCKS
    assert set(final.blocks.values()) <= set(after)
    assert sorted(q for s in servers for q in s.adoptions) == sorted(moving), "a moving partition not handed once"
    assert not servers[0].turn, "the move ended holding the turn: checkpoints would wait for ever"


def _check_aborted(failed: MoveFailed, servers, links: FakeLinks, routing: Routing, moving: set) -> None:
    # The error names the server and the step that failed, and that step did fail.
    assert f"{failed.step.op} on server {failed.step.server}" in str(failed)
    assert (failed.step.server, failed.step.op) in [(s, op) for s, op, what in links.log if what != "ok"]
    _check_never_served_twice(servers)
    # The turn is released unless server 0 never heard the exclude_end (then the error says so).
    ended = [what for s, op, what in links.log if s == 0 and op == "exclude_end"]
    assert not servers[0].turn or (ended and ended[-1] not in ("ok", "late")), "an ended move holds the turn"
    if servers[0].turn:
        assert any("exclude_end on server 0" in u for u in failed.unanswered) or failed.step.op == "exclude_end"
    if failed.moved:
        # Only finishing failed: every partition is on its new owner, and server 0 says so.
        target = rebalance(routing.owners, failed.record.servers_after)
        for q in range(P):
            assert [s.index for s in servers if q in s.owned] == [int(target[q])], f"partition {q}"
        assert np.array_equal(servers[0].routing.owners, target)
        return
    if not failed.undone:
        # Not clean: only because some server (dead, or refusing the undo too) left partitions in doubt.
        assert failed.in_doubt or failed.unanswered
        return
    now = servers[0].routing
    blocks = [b for s in servers for b in s.blocks - s.gone]
    assert sorted(blocks) == BLOCKS, f"after a clean abort every dense block is served once: {sorted(blocks)}"
    assert all(now.blocks.get(b, s.index) == s.index for s in servers for b in s.blocks - s.gone), \
        "server 0's routing names another holder of a dense block"
    armed = {s.switch[1] for s in servers if s.switch is not None}
    assert not armed or now.version >= max(armed), \
        f"a switch armed for routing version {max(armed)}, server 0 routes by {now.version}: sync requests refused"
    for q in range(P):
        holders = [s.index for s in servers if q in s.owned]
        assert len(holders) == 1, f"partition {q} is served by {holders} after a clean abort"
        assert int(now.owners[q]) == holders[0], f"partition {q}: server 0 routes it to {now.owners[q]}, " \
                                                 f"served by {holders[0]}"
        handed = any(q in s.adoptions for s in servers)
        assert q not in failed.in_doubt
        if q not in moving or not handed:
            assert holders == [int(routing.owners[q])], f"partition {q} not handed off, yet on {holders}"
        if holders[0] not in links.dead:
            assert q in servers[holders[0]].rows, f"partition {q}: served by {holders[0]} without its rows"


def test_a_move_without_faults_is_the_scale_and_every_step_is_typed():
    addresses, routing, servers = _cluster(2, 3, sync=False)
    links = CheckingLinks(servers, lambda: "ok")
    record = run_move(links, MovePlan(addresses, [0, 1, 2], per_handoff=2, page_rows=3), timeout=1.0)
    assert record.partitions == P // 3 and record.handoffs == -(-record.partitions // 2)
    ops = [op for _, op, _ in links.log]
    assert ops[0] == "routing_get" and ops[-1] in ("migrate_finish", "dense_finish")
    assert ops.index("migrate_expect") < ops.index("migrate_page") < ops.index("handoff_freeze")
    # The turn (checkpoints wait) from before the first hand-off until after the final routing;
    # the drops come after it.
    last_routing = len(ops) - 1 - ops[::-1].index("routing_set")
    assert ops.index("exclude_begin") < ops.index("handoff_freeze") and ops.count("exclude_begin") == 1
    assert ops.index("exclude_begin") < ops.index("routing_set", ops.index("migrate_page"))
    assert last_routing < ops.index("exclude_end") < ops.index("migrate_finish")
    assert not servers[0].turn
    assert "migrate_abort" not in ops and "handoff_undo" not in ops


@pytest.mark.parametrize("stuck_op", ["migrate_start", "migrate_expect", "migrate_page", "migrate_stage",
                                      "migrate_switch", "exclude_begin", "routing_set", "dense_freeze", "dense_export", "dense_import",
                                      "handoff_freeze", "handoff_rows", "handoff_in", "handoff_done"])
@pytest.mark.parametrize("how", ["lost", "refuse", "late"])
def test_a_stuck_step_aborts_the_move_and_the_old_owners_serve_again(stuck_op, how):
    """The first ``stuck_op`` (of the second hand-off for the hand-off steps: one group is handed
    off before) is not answered in time, refused, or answered late; every other step succeeds.
    (migrate_switch: a sync job's, whose abort must still publish a routing the switch takes.)"""
    addresses, routing, servers = _cluster(2, 3, sync=stuck_op == "migrate_switch")
    skip = 1 if stuck_op.startswith("handoff") else 0
    seen = []

    class Stuck(CheckingLinks):
        def submit(self, requests, timeout=None):
            (server, header, _), = requests
            if header["op"] == stuck_op and not header.get("join"):
                seen.append(server)
                if len(seen) == skip + 1:
                    self.fate = lambda: how
                    try:
                        return super().submit(requests, timeout)
                    finally:
                        self.fate = lambda: "ok"
            return super().submit(requests, timeout)

    links = Stuck(servers, lambda: "ok")
    with pytest.raises(MoveFailed) as caught:
        run_move(links, MovePlan(addresses, [0, 1, 2], per_handoff=2, page_rows=3), timeout=1.0)
    failed = caught.value
    assert failed.step.server == seen[skip] and failed.step.op == stuck_op
    assert f"{stuck_op} on server {seen[skip]}" in str(failed)
    moving = set(np.flatnonzero(rebalance(routing.owners, [0, 1, 2]) != routing.owners).tolist())
    _check_aborted(failed, servers, links, routing, moving)
    assert failed.undone, str(failed)          # every server answers the undo steps: clean
    assert not servers[0].turn, "an aborted move holds the turn: checkpoints would wait for ever"
    # The old owners serve again all that was not handed off: no partition is frozen or expected anywhere.
    assert not any(s.lost or s.incoming or s.copying or s.blocks_in or s.gone for s in servers)
    handed = sorted(q for s in servers for q in s.adoptions)
    if skip:
        assert handed, "a hand-off was done before the stuck step"
    if stuck_op == "handoff_done" and how == "late":
        # Applied on the new owner (only its reply was late): it keeps the group, whose rows the old owner dropped.
        assert set(failed.step.header["partitions"]) <= set(handed)
    for q in handed:
        assert [s.index for s in servers if q in s.rows] == [2], f"partition {q}: rows on two servers or none"


def test_a_late_reply_to_a_step_given_up_is_ignored_and_too_close_arms_a_later_step():
    """Sync: a server that says the switch step is too close gets a later one (not an abort);
    replies fed to a Ready that is no longer the current one change nothing."""
    addresses, routing, servers = _cluster(2, 3, sync=True)
    refusals = []
    plan = MovePlan(addresses, [0, 1, 2], per_handoff=2, page_rows=50)
    while (ready := plan.ready()) is not None:
        replies = []
        for index, step in enumerate(ready.steps):
            if step.op == "migrate_switch" and not refusals:
                refusals.append(step.header["step"])
                plan.fail(ready.number, index, RemoteError(f"server {step.server}", "invalid",
                                                           f"migrate_switch: step {step.header['step']} is too "
                                                           f"close, tables are at {{'emb': 9}}"))
                break
            replies.append(servers[step.server].handle(step.header, step.arrays))
        else:
            plan.feed(ready.number, replies)
            plan.feed(ready.number, replies)          # again, late: that Ready is over
            assert plan.ready() is None or plan.ready().number == ready.number + 1
    record = plan.result()
    assert refusals and record.switch_step == refusals[0] + 2 and record.arm_tries == 2
    assert {s.switch for s in servers} == {(record.switch_step, routing.version + 1)}
    assert np.array_equal(servers[0].routing.owners, rebalance(routing.owners, [0, 1, 2]))


def _steps_of_a_clean_move(before, after, sync, per_handoff, page_rows) -> int:
    addresses, _, servers = _cluster(before, max(after) + 1, sync)
    links = FakeLinks(servers, lambda: "ok")
    run_move(links, MovePlan(addresses, after, per_handoff=per_handoff, page_rows=page_rows), timeout=1.0)
    return len(links.log)


@pytest.mark.parametrize("before, after, sync", [(2, [0, 1, 2], False), (2, [0, 1, 2], True), (3, [0, 1], False)],
                         ids=["2-3-async", "2-3-sync", "3-2-async"])
def test_every_single_and_double_fault_at_every_step(before, after, sync):
    """Exhaustive, beside the random interleavings: each step of the move in turn fails in each
    way, alone, or followed by a lost reply to one of the next eight steps (the abort's own)."""
    length = _steps_of_a_clean_move(before, after, sync, per_handoff=3, page_rows=4)
    cases = [{i: kind} for i in range(length) for kind in ("refuse", "lost", "late", "kill")]
    cases += [{i: "late", i + k: "lost"} for i in range(length) for k in range(1, 9)]
    outcomes = {"done": 0, "clean": 0, "in doubt": 0, "finish failed": 0}
    for faults in cases:
        addresses, routing, servers = _cluster(before, max(after) + 1, sync)
        sent = iter(range(10**6))
        links = CheckingLinks(servers, lambda: faults.get(next(sent), "ok"))
        target = rebalance(routing.owners, after)
        moving = set(np.flatnonzero(target != routing.owners).tolist())
        try:
            run_move(links, MovePlan(addresses, after, per_handoff=3, page_rows=4), timeout=1.0)
            outcomes["done"] += 1
        except MoveFailed as failed:
            _check_aborted(failed, servers, links, routing, moving)
            outcomes["finish failed" if failed.moved else "clean" if failed.undone else "in doubt"] += 1
    # Every fault before the last hand-off aborts the move; those after it leave it done or finishing.
    assert outcomes["clean"] > len(cases) // 3 and outcomes["finish failed"] > 0, outcomes


def _drive(plan, servers, answer=None):
    """Run ``plan`` against the fake servers; ``answer(step)``: an exception to fail the step
    with, or None to let the server handle it. The ops sent, in order."""
    sent = []
    while (ready := plan.ready()) is not None:
        replies = []
        for index, step in enumerate(ready.steps):
            sent.append((step.server, step.op))
            error = answer(step) if answer is not None else None
            if error is not None:
                plan.fail(ready.number, index, error)
                break
            replies.append(servers[step.server].handle(step.header, step.arrays))
        else:
            plan.feed(ready.number, replies)
    return sent


@pytest.mark.parametrize("sync", [False, True])
def test_the_move_takes_its_turn_before_the_first_hand_off_and_ends_it_after_the_final_routing(sync):
    """Checkpoints and the hand-off phase take turns on server 0 (server/elastic/move_exclusion.py): the
    turn is asked once the copy (and in sync mode the arm) is done, before the first routing that
    names a new owner, and ended after the final routing, before the old owners drop anything."""
    addresses, routing, servers = _cluster(2, 3, sync=sync)
    seen = []

    def answer(step):
        seen.append((step, servers[0].turn, servers[0].routing.version))
        return None

    plan = MovePlan(addresses, [0, 1, 2], per_handoff=2, page_rows=3)
    ops = [op for _, op in _drive(plan, servers, answer)]
    record = plan.result()
    begin = ops.index("exclude_begin")
    assert ops.count("exclude_begin") == ops.count("exclude_end") == 1
    assert "migrate_page" in ops[:begin] and "handoff_freeze" not in ops[:begin]
    if sync:
        assert "migrate_switch" in ops[:begin]
        assert seen[begin][0].header["after_step"] == record.switch_step
    # Every hand-off step (and every routing but the joiner's) runs while the move holds the turn.
    for step, turn, _ in seen[begin + 1:ops.index("exclude_end")]:
        assert turn, f"{step} sent outside the move's turn"
    end = ops.index("exclude_end")
    finals = {step.server for step, _, _ in seen[:end]
              if step.op == "routing_set" and step.header["routing"]["version"] == record.routing_version}
    assert ops[end - 1] == "routing_set" and finals == {0, 1, 2}, "the final routing reached every server first"
    assert servers[0].routing.version == record.routing_version
    assert set(ops[end + 1:]) <= {"migrate_finish", "dense_finish", "retire"} and "migrate_finish" in ops[end + 1:]
    assert not servers[0].turn


def test_a_turn_refused_as_timeout_is_asked_again_until_the_patience_passes():
    """Server 0 refuses exclude_begin as "timeout" while a checkpoint outlasts its timeout: the
    move asks again (it does not abort); once ``turn_patience`` passed it aborts, cleanly, and
    ends the turn it may hold."""
    now = [0.0]
    addresses, routing, servers = _cluster(2, 3, sync=False)
    asked = []

    def checkpoint_for(seconds):
        def answer(step):
            if step.op != "exclude_begin":
                return None
            asked.append(now[0])
            if now[0] < seconds:
                now[0] += 30.0                   # each refusal comes after server 0's timeout
                return RemoteError("server 0", "timeout", "exclude_begin: the move's turn: trainer 0's "
                                                          "checkpoint is in progress")
            return None
        return answer

    plan = MovePlan(addresses, [0, 1, 2], per_handoff=2, page_rows=3, monotonic=lambda: now[0], turn_patience=100)
    _drive(plan, servers, checkpoint_for(90))
    assert len(asked) == 4 and plan.result().partitions == P // 3          # granted at the 4th: done
    assert not servers[0].turn

    now[0], asked[:] = 0.0, []
    addresses, routing, servers = _cluster(2, 3, sync=False)
    plan = MovePlan(addresses, [0, 1, 2], per_handoff=2, page_rows=3, monotonic=lambda: now[0], turn_patience=100)
    ops = _drive(plan, servers, checkpoint_for(1000))
    with pytest.raises(MoveFailed, match=r"exclude_begin on server 0 did not succeed .*checkpoint is in progress") \
            as caught:
        plan.result()
    assert len(asked) == 4 and caught.value.undone        # asked at 0, 30, 60, 90; refused at 120 > 100: given up
    assert (0, "exclude_end") in ops and not servers[0].turn
    assert not any(s.lost or s.incoming or s.copying for s in servers)
    assert np.array_equal(servers[0].routing.owners, routing.owners)      # the old owners serve again


@pytest.mark.parametrize("failing", ["handoff_rows", "handoff_done", "dense_import"])
def test_an_aborted_move_ends_its_turn(failing):
    """A move aborted in its hand-off phase ends its turn on server 0 (after publishing the routing
    that names who serves now): otherwise every later checkpoint would wait for it for ever."""
    addresses, routing, servers = _cluster(2, 3, sync=False)
    plan = MovePlan(addresses, [0, 1, 2], per_handoff=2, page_rows=3)
    failed_once = []

    def answer(step):
        if step.op == failing and not failed_once:
            failed_once.append(step)
            return RemoteError(f"server {step.server}", "invalid", f"{failing}: refused (fault injected)")
        return None

    ops = _drive(plan, servers, answer)
    with pytest.raises(MoveFailed) as caught:
        plan.result()
    assert caught.value.undone and caught.value.step.op == failing
    end = ops.index((0, "exclude_end"))
    assert ops.index((0, "exclude_begin")) < ops.index((failed_once[0].server, failing)) < end
    assert not servers[0].turn
    # The restored routing reaches server 0 before the turn ends.
    assert max(i for i, (s, op) in enumerate(ops) if (s, op) == (0, "routing_set")) < end


def test_a_failed_final_routing_still_ends_the_turn():
    addresses, routing, servers = _cluster(2, 3, sync=False)
    plan = MovePlan(addresses, [0, 1, 2], per_handoff=16, page_rows=3)

    def answer(step):      # server 1 (an old owner) is sent only the final routing
        if step.op == "routing_set" and step.server == 1:
            return DeadlineExceeded("scaler waited 1 s for server 1 [routing_set, connected]")
        return None

    ops = _drive(plan, servers, answer)
    with pytest.raises(MoveFailed) as caught:
        plan.result()
    assert caught.value.moved and caught.value.step.op == "routing_set"
    assert (0, "exclude_end") in ops and not servers[0].turn


def test_the_copy_is_pipelined_every_source_pages_while_the_new_owners_take_pages_in():
    """One round trip a page: a copy Ready asks every source for its next page and gives the new
    owner the pages the round before brought (2 -> 3: servers 0 and 1 both give to server 2)."""
    addresses, routing, servers = _cluster(2, 3, sync=False)
    plan = MovePlan(addresses, [0, 1, 2], per_handoff=4, page_rows=3)
    copies = []
    while (ready := plan.ready()) is not None:
        if ready.phase == "copy":
            copies.append(sorted((step.server, step.op) for step in ready.steps))
        plan.feed(ready.number, [servers[step.server].handle(step.header, step.arrays) for step in ready.steps])
    plan.result()
    assert copies[0] == [(0, "migrate_page"), (1, "migrate_page")], "the sources page side by side"
    pages = {s: sum(step == (s, "migrate_page") for c in copies for step in c) for s in (0, 1)}
    assert len(copies) == max(pages.values()) + 1, "a round per page, and one to take the last pages in"
    assert any((2, "migrate_stage") in c and (0, "migrate_page") in c for c in copies)


@pytest.mark.parametrize("removed, after", [(2, [0, 1]), (1, [0, 2])])
def test_a_removed_server_gone_before_its_tidying_leaves_the_move_done(removed, after):
    """`scale --remove-host`: a removed server may stop by itself once the final routing lets its
    trainers go (some left, the others let go of it), before it is sent migrate_finish and retire.
    It owns nothing by then: the move is done, the steps it missed are noted, the others finish."""
    addresses, routing, servers = _cluster(3, 3, sync=False)
    plan = MovePlan(addresses, after, per_handoff=16, page_rows=3)
    final_sent = []

    def answer(step):
        if step.op == "routing_set" and step.header["routing"]["addresses"][removed] == "":
            final_sent.append(step.server)
        if step.server == removed and removed in final_sent and step.op != "routing_set":   # it stopped since
            return ServerUnavailable(f"scaler lost its connection to server {removed}")
        return None

    ops = _drive(plan, servers, answer)
    record = plan.result()
    assert record.servers_after == after and record.partitions > 0
    missed = [u.split(" (")[0] for u in record.unfinished]
    assert missed[0] == f"migrate_finish on server {removed}" and missed[-1] == f"retire on server {removed}"
    assert all(m.endswith(f" on server {removed}") for m in missed) and len(missed) <= 3, missed
    kept = [s for s in range(3) if s != removed]
    assert all((s, "migrate_finish") in ops for s in kept) and (0, "exclude_end") in ops
    for s in kept:
        assert not servers[s].copying and not servers[s].gone
    assert not servers[0].turn


def test_a_removed_servers_index_is_never_given_partitions_again():
    """Trainers and peers let go of a removed server for good: a server added again takes a new
    index, as the launcher's scale does (a benchmark that reused index 2 failed its trainers with
    'server 2 (removed by a scale) is no server of the job any more')."""
    addresses, routing, servers = _cluster(3, 3, sync=False)
    run_move(CheckingLinks(servers, lambda: "ok"), MovePlan(addresses, [0, 1], per_handoff=64, page_rows=50),
             timeout=1.0)
    plan = MovePlan(addresses, [0, 1, 2], per_handoff=64, page_rows=50)
    _drive(plan, servers)
    with pytest.raises(ConfigError, match=r"servers \[2\] were removed .* new index \(the next is 3\)"):
        plan.result()


class NoTables(FakeServer):
    """A job with dense blocks and no sparse table yet."""

    def op_migrate_tables(self, h, a):
        return {"tables": [], "sync": self.sync}, []

    def op_migrate_tables_in(self, h, a):
        return {"tables": []}, []


def test_a_job_without_sparse_tables_moves_its_dense_blocks():
    """The pipelined copy has no page to ask for (it failed with an IndexError on no table)."""
    addresses, routing, _ = _cluster(2, 3, sync=False)
    servers = [NoTables(i, routing, joining=i >= 2, sync=False) for i in range(3)]
    plan = MovePlan(addresses, [0, 1, 2], per_handoff=64, page_rows=50)
    ops = _drive(plan, servers)
    record = plan.result()
    assert record.blocks > 0 and not any(op == "migrate_page" for _, op in ops)
    assert servers[2].blocks and not servers[2].blocks_in, "the new server took its blocks"


@pytest.mark.parametrize("removed, after", [(1, [0, 2]), (2, [0, 1])])
def test_a_removed_server_takes_the_final_routing_before_server_0_publishes_it(removed, after):
    """A trainer learns the final routing from server 0 and then closes its link to the removed
    server, which must be retired by then: a closed link is a leave on a retired server and a
    loss (a grace period, then it exits 1: "no trainer can push any more") on one that does not
    know yet. Its routing_set goes out alone, answered, before any other server's."""
    addresses, routing, servers = _cluster(3, 3, sync=False)
    plan = MovePlan(addresses, after, per_handoff=16, page_rows=3)
    waves = []
    while (ready := plan.ready()) is not None:
        finals = [s.server for s in ready.steps
                  if s.op == "routing_set" and s.header["routing"]["addresses"][removed] == ""]
        if finals:
            waves.append(finals)
        plan.feed(ready.number, [servers[s.server].handle(s.header, s.arrays) for s in ready.steps])
    plan.result()
    assert waves == [[removed], sorted({0, 1, 2} - {removed})], waves
