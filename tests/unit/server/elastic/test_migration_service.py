"""server/elastic/migration_service.py: a partition's rows move whole, exactly once, with their state.

Two services (an old and a new owner, each with its own SparseService and numpy store) run the
ops the coordinator sends (launch/elastic/server_scaling.py), with pushes in between: the oracle is a
third table that received the same pushes and never moved. After the hand-off the new owner's
rows of the moved partitions equal the oracle's (values, Adagrad state, update counts, last-seen
clocks, admission counters) and the old owner has none left.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import paramshard as ps
from paramshard.errors import ConfigError, Moved
from paramshard.mode import Mode
from paramshard.placement.partitions import Routing, partition_of, rebalance
from paramshard.server.core.barrier import Membership
from paramshard.server.core.context import ServerContext
from paramshard.server.core.hooks import Incoming, Verdict
from paramshard.server.elastic.migration_service import MigrationService
from paramshard.server.storage.numpy_row_store import NumpyRowStore
from paramshard.server.services.sparse_service import SparseService
from paramshard.server.core.waiting import WaitingList
from paramshard.tables import Admission, Eviction, policy_to_wire
from paramshard.transport import protocol

P, DIM, TABLE = 16, 4, "emb"
ADDRESSES = ["a:1", "b:2"]


def _server(server_id: int, routing: Routing):
    membership = Membership(1, grace=5.0)
    resubmitted = []
    context = ServerContext(server_id, Mode.ASYNC, membership, 5.0,
                            WaitingList(f"server {server_id}", membership, 5.0, Counter()),
                            resubmit=resubmitted.append)
    sparse = SparseService("async", membership, store=NumpyRowStore)
    service = MigrationService(context, sparse, routing)
    return service, sparse, resubmitted


def _register(sparse, unseen_steps: int = 1000):
    sparse.handle_register_sparse({"table": TABLE, "dim": DIM, "seed": 5, "trainer": 0,
                                   "optimizer": ps.optim.Adagrad(lr=0.1).to_wire(),
                                   "policy": policy_to_wire(Admission(min_count=2), Eviction(unseen_steps), 0.1)},
                                  [])


def _request(op: str, ids: np.ndarray, grads=None) -> Incoming:
    header = {"op": op, "id": 1, "table": TABLE, "trainer": 0, "step": 0, "min_version": 0, "distinct": True}
    arrays = [ids] + ([grads] if grads is not None else [])
    frames = [b"identity"] + protocol.encode(header, arrays)
    return Incoming(op, protocol.decode_header(frames[1]), 0, held=frames)


def _serve(service, sparse, op, ids, grads=None):
    """What the server loop does with a request: its hooks, then its handler, then ``applied``."""
    request = _request(op, ids, grads)
    hook = service.hooks()[0]
    if hook.admit(request) is Verdict.HOLD:
        return "held"
    if op == "pull_sparse":
        sparse.table(TABLE).pull(ids, 0)
    else:
        sparse.handle_push_sparse(request.header, [ids, grads])
    hook.applied(request)
    return "done"


def _call(service, op, arrays=(), **fields):
    header = {"op": op, **fields}
    protocol.validate_request(header)
    reply = service.ops()[op](header, list(arrays))
    if hasattr(reply, "make_reply"):          # a Deferred: ready at once here (async, nothing pending)
        assert reply.ready()
        reply = reply.make_reply()
    return reply.fields, reply.arrays


def _drop_in_slices(service, sparse, traffic=None, slice_rows=64):
    """migrate_finish only marks what to drop: the hook's ticks drop it a slice at a time, with
    requests served in between; no slice reads more than its rows."""
    from paramshard.server.storage import sparse_table
    table = sparse.table(TABLE)
    assert table.dropping, "migrate_finish dropped nothing at once"
    slices = 0
    original = sparse_table.DROP_SLICE
    sparse_table.SparseTable.drop_some.__defaults__ = (slice_rows,)
    try:
        while table.dropping:
            rows = table.num_rows
            service.drop_some(budget_s=0.0)            # one slice a tick
            assert rows - table.num_rows <= slice_rows
            slices += 1
            if traffic is not None:
                traffic(1)
            assert slices < 10_000
    finally:
        sparse_table.SparseTable.drop_some.__defaults__ = (original,)
    assert slices > 1, "dropped in one go"


def _rows_by_id(table, ids):
    rows = table.store.lookup(ids)
    assert (rows >= 0).all()
    return {"values": table.store.gather(rows), **table.store.state_of(rows)}


@pytest.mark.parametrize("unseen_steps", [1000, 6], ids=["no-eviction", "eviction-during-the-copy"])
def test_a_move_keeps_every_row_and_its_state_and_applies_each_push_once(unseen_steps):
    routing = Routing.initial(P, ADDRESSES)
    old, old_sparse, _ = _server(0, routing)
    new, new_sparse, held = _server(1, routing)
    oracle = SparseService("async", Membership(1, grace=5.0), store=NumpyRowStore)
    for s in (old_sparse, new_sparse, oracle):
        _register(s, unseen_steps)
    rng = np.random.default_rng(1)
    all_ids = np.arange(4000, dtype=np.uint64)
    mine = all_ids[routing.servers_of(all_ids) == 0]

    def traffic(n, pool=mine):
        for _ in range(n):
            ids = np.unique(rng.choice(pool, 40))
            grads = rng.standard_normal((len(ids), DIM)).astype(np.float32)
            for service, sparse in ((old, old_sparse), (None, oracle)):
                if service is None:
                    sparse.table(TABLE).pull(ids, 0)
                    sparse.handle_push_sparse({"table": TABLE, "trainer": 0, "step": 0, "distinct": True},
                                              [ids, grads])
                else:
                    _serve(service, sparse, "pull_sparse", ids)
                    _serve(service, sparse, "push_sparse", ids, grads)

    traffic(30)
    moving = [0, 2, 4]          # server 0's even partitions go to server 1 (as a move to 1 server would)
    # The new owner joins with its tables, the copy starts, rows go in small pages with pushes between.
    _call(new, "routing_set", routing=routing.to_wire(), join=True)
    _call(old, "migrate_start", partitions=moving)
    _call(new, "migrate_expect", partitions=moving)
    start = 0
    while True:
        fields, arrays = _call(old, "migrate_page", table=TABLE, start=start, count=50)
        _call(new, "migrate_stage", arrays, table=TABLE, parts=fields["parts"])
        traffic(2)
        start += 50
        if start >= fields["total"]:
            break
    in_moving = np.isin(partition_of(mine, P), moving)
    assert _serve(new, new_sparse, "pull_sparse", mine[in_moving][:3]) == "held", "rows not here yet: held"
    owners = routing.owners.copy()
    owners[moving] = 1
    _call(old, "routing_set", routing=routing.moved_to(owners).to_wire())
    _call(old, "handoff_freeze", partitions=moving)
    with pytest.raises(Moved):        # refused whole: the owned ids of this push are not applied either
        _serve(old, old_sparse, "push_sparse", mine[:50], np.ones((50, DIM), np.float32))
    fields, arrays = _call(old, "handoff_rows", table=TABLE, partitions=moving)
    _call(new, "handoff_in", arrays, table=TABLE, parts=fields["parts"])
    _call(new, "handoff_done", partitions=moving)
    assert len(held) == 1, "the held pull runs again once the rows are in"
    _call(old, "migrate_finish")
    # Served between slices (with eviction on, the oracle's clock would then run ahead of the new owner's).
    _drop_in_slices(old, old_sparse, lambda n: traffic(n, mine[~in_moving]) if unseen_steps >= 1000 else None)

    moved_ids = mine[in_moving]
    stayed = mine[~in_moving]
    moved_ids = moved_ids[oracle.table(TABLE).store.lookup(moved_ids) >= 0]
    assert len(moved_ids) > 20
    assert (old_sparse.table(TABLE).store.lookup(moved_ids) == -1).all(), "the old owner dropped them"
    assert new_sparse.table(TABLE).num_rows == len(moved_ids), "no row the oracle evicted came back"
    if unseen_steps < 1000:
        assert oracle.table(TABLE).evicted > 0
    want, got = _rows_by_id(oracle.table(TABLE), moved_ids), _rows_by_id(new_sparse.table(TABLE), moved_ids)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    kept = stayed[oracle.table(TABLE).store.lookup(stayed) >= 0]
    for name, value in _rows_by_id(oracle.table(TABLE), kept).items():
        np.testing.assert_array_equal(_rows_by_id(old_sparse.table(TABLE), kept)[name], value, err_msg=name)
    # Admission counters of the moved partitions (ids seen once, no row yet) came along.
    counted, counts = oracle.table(TABLE).store.counters()
    theirs = np.isin(partition_of(counted, P), moving)
    got_counted, got_counts = new_sparse.table(TABLE).store.counters()
    assert dict(zip(got_counted.tolist(), got_counts.tolist())) == \
        dict(zip(counted[theirs].tolist(), counts[theirs].tolist()))


def test_retire_needs_an_empty_server_and_fixed_jobs_cannot_move():
    routing = Routing.initial(P, ADDRESSES)
    service, _, _ = _server(1, routing)
    with pytest.raises(ConfigError, match="still serves"):
        _call(service, "retire")
    _call(service, "routing_set", routing=routing.moved_to(rebalance(routing.owners, [0])).to_wire())
    service.ownership.owned[:] = False
    assert _call(service, "retire")[0] == {"retired": True} and not service.ctx.stopping
    assert _call(service, "retire", exit=True)[0] == {"retired": True} and service.ctx.stopping
    fixed, _, _ = _server(0, Routing.initial(0, ADDRESSES))
    with pytest.raises(ConfigError, match="PARAMSHARD_PARTITIONS"):
        _call(fixed, "migrate_start", partitions=[0])


def test_pages_are_checked_against_the_tables_own_layout():
    from paramshard.server.elastic.partition_intake import checked_page
    routing = Routing.initial(P, ADDRESSES)
    _, sparse, _ = _server(0, routing)
    _register(sparse)
    table = sparse.table(TABLE)
    ids = np.arange(3, dtype=np.uint64)
    table.pull(ids, 0)
    table.pull(ids, 0)          # admitted (min_count 2)
    good = table.store.page(0, 3)
    assert set(checked_page(table, list(good), list(good.values()))) == set(good)
    for parts, arrays, why in (
            (["ids", "values", "slot9"], [ids, good["values"], good["values"]], "does not have"),
            (["ids", "values"], [ids, good["values"].astype(np.float64)], "expected float32"),
            (["ids", "values"], [ids, good["values"][:, :2]], "expected float32"),
            (["ids", "values"], [ids.astype(np.int64), good["values"]], "expected uint64"),
            (["ids", "ids"], [ids, ids], "once")):
        with pytest.raises(ConfigError, match=why):
            checked_page(table, parts, arrays)


def test_server_0_says_the_routing_each_trainer_sends_by_and_routings_name_the_peers_to_watch():
    """Issue 29: a removed server exits once every trainer's requests carry a routing that retires
    it (server 0's routing_get says which each carried); a routing set on a server names the peer
    servers it watches (added ones included, retired ones "")."""
    routing = Routing.initial(P, ADDRESSES)
    service, _, _ = _server(0, routing)
    service.ctx.membership.note_request(0)
    told = []
    service.on_addresses = told.append
    assert _call(service, "routing_get")[0]["trainers"] == [[0, -1]]      # arrived, no routing carried yet
    hook = service.hooks()[0]
    for version in (3, 1):
        hook.admit(Incoming("push_dense", {"op": "push_dense", "trainer": 0, "routing": version}, 0))
    assert _call(service, "routing_get")[0]["trainers"] == [[0, 3]]
    retiring = routing.moved_to(rebalance(routing.owners, [0, 2]), addresses=["a:1", "", "c:3"])
    _call(service, "routing_set", routing=retiring.to_wire())
    assert told == [("a:1", "", "c:3")]
    with pytest.raises(ConfigError, match="never retires"):
        _call(service, "retire")


def test_an_aborted_hand_off_gives_the_partitions_back_to_the_old_owner_untouched():
    """The new owner stops answering after the freeze: migrate_abort (the new owner gives up what it
    expected, its held requests run again and are refused), handoff_undo (the old owner serves the
    frozen partitions again) and migrate_finish leave the old owner's rows as an unmoved table's."""
    routing = Routing.initial(P, ADDRESSES)
    old, old_sparse, _ = _server(0, routing)
    new, new_sparse, held = _server(1, routing)
    oracle = SparseService("async", Membership(1, grace=5.0), store=NumpyRowStore)
    for s in (old_sparse, new_sparse, oracle):
        _register(s)
    all_ids = np.arange(2000, dtype=np.uint64)
    mine = all_ids[routing.servers_of(all_ids) == 0]
    rng = np.random.default_rng(3)

    def push(service, sparse, ids):
        grads = rng.standard_normal((len(ids), DIM)).astype(np.float32)
        assert _serve(service, sparse, "pull_sparse", ids) == "done"
        assert _serve(service, sparse, "push_sparse", ids, grads) == "done"
        oracle.table(TABLE).pull(ids, 0)
        oracle.handle_push_sparse({"table": TABLE, "trainer": 0, "step": 0, "distinct": True}, [ids, grads])

    for _ in range(5):
        push(old, old_sparse, np.unique(rng.choice(mine, 40)))
    moving = [0, 2, 4]
    in_moving = np.isin(partition_of(mine, P), moving)
    _call(new, "routing_set", routing=routing.to_wire(), join=True)
    _call(old, "migrate_start", partitions=moving)
    _call(new, "migrate_expect", partitions=moving)
    fields, arrays = _call(old, "migrate_page", table=TABLE, start=0, count=10_000)
    _call(new, "migrate_stage", arrays, table=TABLE, parts=fields["parts"])
    assert _serve(new, new_sparse, "pull_sparse", mine[in_moving][:3]) == "held"
    _call(old, "handoff_freeze", partitions=moving)
    fields, arrays = _call(old, "handoff_rows", table=TABLE, partitions=moving)
    _call(new, "handoff_in", arrays, table=TABLE, parts=fields["parts"])
    # ... and handoff_done never comes: the move is aborted.
    assert _call(new, "migrate_abort", partitions=moving, names=[])[0] == {"owned": [], "blocks": []}
    assert len(held) == 1, "the held pull is run again (and refused: the partitions are not coming)"
    with pytest.raises(Moved):
        _serve(new, new_sparse, "pull_sparse", mine[in_moving][:3])
    assert new_sparse.table(TABLE).dropping, "the rows taken in for the aborted partitions are strays"
    new.drop_some(budget_s=10.0)
    assert new_sparse.table(TABLE).num_rows == 0, "the strays went, a slice at a time"
    with pytest.raises(ConfigError, match="not expecting"):
        _call(new, "handoff_done", partitions=moving)      # a late hand-off cannot land any more
    assert _call(old, "handoff_undo", partitions=moving + [1], names=[])[0] == {"restored": moving, "blocks": []}
    _call(old, "migrate_finish")
    push(old, old_sparse, mine[in_moving][:30])             # served again, by the old owner
    ids = mine[oracle.table(TABLE).store.lookup(mine) >= 0]
    want, got = _rows_by_id(oracle.table(TABLE), ids), _rows_by_id(old_sparse.table(TABLE), ids)
    assert old_sparse.table(TABLE).num_rows == len(ids), "the old owner dropped no row"
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_pages_become_rows_as_they_come_and_the_hand_off_writes_only_rows_touched_since():
    """A sync move hands every partition off at one step with the trainers waiting: the copied
    pages are rows already (never served before the hand-off: a pull is held), and the hand-off
    writes only the rows written since the copy began, however many rows the partitions hold."""
    routing = Routing.initial(P, ADDRESSES)
    old, old_sparse, _ = _server(0, routing)
    new, new_sparse, held = _server(1, routing)
    for s in (old_sparse, new_sparse):
        _register(s)
    all_ids = np.arange(4000, dtype=np.uint64)
    mine = all_ids[routing.servers_of(all_ids) == 0]
    for _ in range(2):          # admitted at the second sighting
        _serve(old, old_sparse, "pull_sparse", mine)
    moving = [0, 2, 4]
    in_moving = np.isin(partition_of(mine, P), moving)
    _call(new, "routing_set", routing=routing.to_wire(), join=True)
    _call(old, "migrate_start", partitions=moving)
    _call(new, "migrate_expect", partitions=moving)
    fields, arrays = _call(old, "migrate_page", table=TABLE, start=0, count=10_000)
    _call(new, "migrate_stage", arrays, table=TABLE, parts=fields["parts"])
    table = new_sparse.table(TABLE)
    assert table.num_rows == in_moving.sum(), "the page's rows are rows here already"
    assert _serve(new, new_sparse, "pull_sparse", mine[in_moving][:3]) == "held", "but not served yet"
    touched = np.concatenate([mine[in_moving][:5], np.array([10**9 + p for p in range(64)], np.uint64)])
    touched = touched[np.isin(partition_of(touched, P), moving)]          # 5 old rows, some new ones
    grads = np.ones((len(touched), DIM), np.float32)
    for _ in range(2):
        _serve(old, old_sparse, "pull_sparse", touched)
    _serve(old, old_sparse, "push_sparse", touched, grads)
    _call(old, "handoff_freeze", partitions=moving)
    fields, arrays = _call(old, "handoff_rows", table=TABLE, partitions=moving)
    written = []
    for name in ("create", "set_values"):
        real = getattr(table.store, name)
        setattr(table.store, name, (lambda real: lambda rows, *a, **k: written.append(len(rows)) or real(rows, *a, **k))(real))
    _call(new, "handoff_in", arrays, table=TABLE, parts=fields["parts"])
    _call(new, "handoff_done", partitions=moving)
    assert sum(written) == len(touched), "the hand-off wrote the touched rows, no other"
    assert len(held) == 1
    ids = np.concatenate([mine[in_moving], touched[5:]])
    want, got = _rows_by_id(old_sparse.table(TABLE), ids), _rows_by_id(table, ids)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
