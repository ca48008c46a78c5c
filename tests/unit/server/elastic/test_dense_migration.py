"""server/elastic/dense_migration.py: a dense block moves whole between two servers' stores, with pushes
around the hand-off. The oracle is a third store that received the same pushes and never moved:
after the move the new owner's block (values, Adam slots, version) equals it; requests for a
block handed away are refused as ``moved`` before anything is applied, and requests for a block
on its way are held and run once it is in."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import paramshard as ps
from paramshard.errors import ConfigError, Moved
from paramshard.mode import Mode
from paramshard.placement.partitions import Routing
from paramshard.server.core.barrier import Membership
from paramshard.server.core.context import ServerContext
from paramshard.server.services.dense_handlers import DenseHandlers
from paramshard.server.elastic.dense_migration import DenseMigration
from paramshard.server.storage.dense_store import DenseStore
from paramshard.server.core.hooks import Incoming, Verdict
from paramshard.server.elastic.migration_service import MigrationService
from paramshard.server.services.sparse_service import SparseService
from paramshard.server.core.waiting import WaitingList

OPT = ps.optim.Adam(lr=0.1)


def _server(server_id: int, mode=Mode.ASYNC, partitions=16):
    membership = Membership(1, grace=5.0)
    resubmitted = []
    context = ServerContext(server_id, mode, membership, 5.0,
                            WaitingList(f"server {server_id}", membership, 5.0, Counter()),
                            resubmit=resubmitted.append)
    migration = MigrationService(context, SparseService(mode.value, membership), Routing.initial(partitions,
                                                                                                  ["a:1", "b:2"]))
    dense = DenseStore(mode, membership)
    return DenseMigration(context, dense, migration), DenseHandlers(dense), resubmitted


def _push(handlers, step, names, value=1.0):
    handlers.handle_push_dense({"trainer": 0, "step": step, "names": names, "reply_values": False},
                               [np.full(3, value * (step + 1), np.float32) for _ in names])


def _admit(service, op, names, step=0, routing=None):
    header = {"op": op, "names": names, "step": step, "min_version": step, "trainer": 0}
    if routing is not None:
        header["routing"] = routing
    return service.hooks()[0].admit(Incoming(op, header, 0, held=("frames", op, tuple(names))))


def test_a_block_moves_whole_with_its_optimizer_state_and_requests_follow_it():
    old, old_h, _ = _server(0)
    new, new_h, resubmitted = _server(1)
    oracle = DenseStore("async", Membership(1, grace=5.0))
    start = [np.arange(3, dtype=np.float32), np.ones(3, np.float32)]
    for store in (old.dense, oracle):
        store.register(0, ["w", "v"], [a.copy() for a in start], OPT, 9)
    for step in range(2):
        _push(old_h, step, ["w", "v"])
        oracle.push(0, step, ["w", "v"], [np.full(3, step + 1.0, np.float32)] * 2)

    new.handle_dense_expect({"names": ["w"]}, [])
    assert _admit(new, "push_dense", ["w"]) is Verdict.HOLD           # on its way: held, not applied
    assert _admit(old, "push_dense", ["w", "v"]) is Verdict.ACCEPT    # still the old owner's
    with pytest.raises(ConfigError, match="freeze these blocks first"):
        old.handle_dense_export({"names": ["w"]}, [])
    old.handle_dense_freeze({"names": ["w"]}, [])
    with pytest.raises(Moved):
        _admit(old, "push_dense", ["w", "v"])                         # refused whole
    assert _admit(old, "pull_dense", ["v"]) is Verdict.ACCEPT
    reply = old.handle_dense_export({"names": ["w"]}, [])
    new.handle_dense_import({**reply.fields, "lr_scale": float(reply.fields["lr_scale"])}, reply.arrays)
    assert resubmitted == [("frames", "push_dense", ("w",))]
    assert _admit(new, "push_dense", ["w"]) is Verdict.ACCEPT
    got, want = new.dense.blocks["w"], oracle.blocks["w"]
    assert got.version == want.version == 2
    np.testing.assert_array_equal(got.values, want.values)
    for a, b in zip(got.slots, want.slots):
        np.testing.assert_array_equal(a, b)
    # Training goes on at the new owner exactly as at a store that never moved.
    _push(new_h, 2, ["w"])
    oracle.push(0, 2, ["w"], [np.full(3, 3.0, np.float32)])
    np.testing.assert_array_equal(new.dense.blocks["w"].values, oracle.blocks["w"].values)
    assert old.handle_dense_finish({}, []).fields["dropped"] == 1 and "w" not in old.dense.blocks
    with pytest.raises(Moved):
        _admit(old, "pull_dense", ["w"])
    assert _admit(new, "pull_dense", ["v"]) is Verdict.ACCEPT        # never here: the handler says so
    with pytest.raises(ConfigError, match="unknown blocks"):
        new_h.handle_pull_dense({"names": ["v"], "min_version": 0, "plan_fingerprint": 9}, [])
    with pytest.raises(ConfigError, match="not expecting"):
        new.handle_dense_import({**reply.fields, "lr_scale": 1.0}, reply.arrays)


def test_sync_switch_refuses_old_routing_and_holds_at_the_new_owner():
    old, old_h, _ = _server(0, Mode.SYNC)
    new, _, _ = _server(1, Mode.SYNC)
    old.dense.register(0, ["w"], [np.zeros(3, np.float32)], OPT, 9)
    for service in (old, new):
        service.migration.ownership.arm(2, 1)
    new.handle_dense_expect({"names": ["w"]}, [])
    assert _admit(old, "push_dense", ["w"], step=1, routing=0) is Verdict.ACCEPT     # before the switch
    with pytest.raises(Moved, match="routing version 1"):
        _admit(old, "push_dense", ["w"], step=2, routing=0)
    assert _admit(new, "pull_dense", ["w"], step=2, routing=1) is Verdict.HOLD
    freeze = old.handle_dense_freeze({"names": ["w"]}, [])
    assert not freeze.ready()                      # the step before the switch is not complete
    _push(old_h, 0, ["w"])
    _push(old_h, 1, ["w"])
    assert freeze.ready()
    freeze.make_reply()
    assert "w" in old.gone


def test_a_job_without_partitions_cannot_move_blocks():
    service, _, _ = _server(0, partitions=0)
    assert _admit(service, "push_dense", ["w"]) is Verdict.ACCEPT
    with pytest.raises(ConfigError, match="PARAMSHARD_PARTITIONS=0"):
        service.handle_dense_expect({"names": ["w"]}, [])


def test_one_hold_queue_for_partitions_and_blocks_released_by_either_and_expiring_together():
    """server/elastic/move_holds.py: a request held for a block and one held for a partition share the
    server's one queue. Either arrival admits every held request again (the other is held
    again, its thing still coming); a stalled move stops expecting both at once."""
    clock = [0.0]
    new, _, resubmitted = _server(1)
    sparse = new.migration
    sparse.ownership.holds.clock = lambda: clock[0]
    assert new.holds is sparse.ownership.holds, "one queue"
    sparse.ownership.set_routing(sparse.ownership.routing, join=True)
    sparse.handle_migrate_expect({"partitions": [3]}, [])
    new.handle_dense_expect({"names": ["w"]}, [])
    assert _admit(new, "pull_dense", ["w"]) is Verdict.HOLD
    sparse.ownership.hold("a sparse request")
    assert len(new.holds) == 2
    sparse.ownership.adopt([3])                    # the partition arrived: both are admitted again
    assert len(new.holds) == 0 and sparse.ownership.owned[3]
    clock[0] = 1.0
    assert _admit(new, "pull_dense", ["w"]) is Verdict.HOLD      # the block is still coming: held again
    assert new.expired(5.0) == [] and new.incoming == {"w"}
    sparse.handle_migrate_expect({"partitions": [5]}, [])
    clock[0] = 7.0
    assert len(new.expired(5.0)) == 1, "held past the timeout: admitted again"
    assert not new.incoming and not sparse.ownership.incoming.any(), "the stalled move expects nothing any more"


def test_a_later_moves_new_owner_holds_blocks_only_from_its_own_switch():
    """Sync 2 -> 3 -> 2 (see test_partition_ownership): server 0 expects a block in the second move;
    requests of steps past the first move's switch naming blocks it holds are served until the
    second move arms its own switch."""
    service, _, _ = _server(0, Mode.SYNC)
    own = service.migration.ownership
    own.arm(2, 1)
    own.set_routing(own.routing.moved_to(own.routing.owners, version=2))     # the first move's end
    service.handle_dense_expect({"names": ["w"]}, [])
    assert _admit(service, "push_dense", ["v"], step=3, routing=2) is Verdict.ACCEPT
    assert _admit(service, "push_dense", ["w"], step=3, routing=2) is Verdict.HOLD    # the block on its way
    own.arm(5, 3)
    assert _admit(service, "push_dense", ["v"], step=5, routing=3) is Verdict.HOLD
