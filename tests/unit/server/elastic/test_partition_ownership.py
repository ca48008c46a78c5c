"""server/elastic/partition_ownership.py: the states of a partition on one server through a move."""
from __future__ import annotations

import numpy as np
import pytest

from paramshard.errors import ConfigError, Moved
from paramshard.placement.partitions import Routing, partition_of
from paramshard.server.core.hooks import Verdict
from paramshard.server.elastic.partition_ownership import PartitionOwnership

P = 64


def _ids_in(partition: int, n: int = 3) -> np.ndarray:
    ids = np.arange(20000, dtype=np.uint64)
    return ids[partition_of(ids, P) == partition][:n]


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


def test_owned_accepted_foreign_refused_whole_incoming_held():
    own = PartitionOwnership(0, Routing.initial(P, ["a:1", "b:2"]))     # even partitions are server 0's
    assert own.verdict(np.concatenate([_ids_in(0), _ids_in(2)])) is Verdict.ACCEPT
    with pytest.raises(Moved, match="partitions \\[1\\]"):
        own.verdict(np.concatenate([_ids_in(0), _ids_in(1)]))
    own.expect([1])
    assert own.verdict(np.concatenate([_ids_in(0), _ids_in(1)])) is Verdict.HOLD
    with pytest.raises(Moved):
        own.verdict(_ids_in(3))
    assert own.verdict(np.zeros(0, np.uint64)) is Verdict.ACCEPT
    own.hold("request")
    assert own.adopt([1]) == ["request"]
    assert own.verdict(_ids_in(1)) is Verdict.ACCEPT


def test_dirty_ids_are_those_of_copying_partitions_touched_since():
    own = PartitionOwnership(0, Routing.initial(P, ["a:1", "b:2"]))
    own.note_applied("t", _ids_in(2))          # before the copy: not dirty
    own.start_copy([2, 4])
    own.note_applied("t", np.concatenate([_ids_in(2, 2), _ids_in(6)]))
    own.note_applied("t", _ids_in(4, 1))
    np.testing.assert_array_equal(own.dirty_ids("t", np.array([2])), np.sort(_ids_in(2, 2)))
    np.testing.assert_array_equal(own.dirty_ids("t", np.array([2, 4])), np.sort(np.concatenate([_ids_in(2, 2),
                                                                                               _ids_in(4, 1)])))
    own.freeze([2])
    with pytest.raises(Moved):
        own.verdict(_ids_in(2))
    assert own.verdict(_ids_in(4)) is Verdict.ACCEPT
    with pytest.raises(ConfigError, match="freeze"):
        own.frozen([4])
    lost = own.finish()
    assert np.flatnonzero(lost).tolist() == [2] and not own.dirty and not own.copying.any()


def test_steps_out_of_order_are_refused():
    own = PartitionOwnership(1, Routing.initial(P, ["a:1", "b:2"]))
    with pytest.raises(ConfigError):
        own.start_copy([0])           # not its own
    with pytest.raises(ConfigError):
        own.freeze([1])               # not being copied
    with pytest.raises(ConfigError):
        own.expect([1])               # already its own
    with pytest.raises(ConfigError):
        own.adopt([0])                # not expected
    with pytest.raises(ConfigError, match="fixed hash"):
        PartitionOwnership(0, Routing.initial(0, ["a:1"])).start_copy([0])


def test_a_joining_server_owns_nothing_and_routing_never_goes_back():
    routing = Routing.initial(P, ["a:1", "b:2", "c:3"])
    own = PartitionOwnership(2, routing)
    own.set_routing(Routing.initial(P, ["a:1", "b:2"]).moved_to(routing.owners * 0, version=3,
                                                               addresses=["a:1", "b:2", "c:3"]), join=True)
    assert not own.owned.any()
    with pytest.raises(ConfigError, match="older"):
        own.set_routing(routing)


def test_held_requests_run_again_when_a_move_stalls():
    clock = Clock()
    own = PartitionOwnership(0, Routing.initial(P, ["a:1", "b:2"]), clock=clock)
    own.expect([1])
    own.hold("r1")
    clock.now = 5.0
    assert own.expired(10.0) == []
    clock.now = 10.0
    assert own.expired(10.0) == ["r1"] and not own.incoming.any()


def test_a_later_moves_new_owner_holds_only_from_its_own_switch():
    """Sync 2 -> 3 -> 2: server 0 is armed for the first move (it takes nothing then) and takes
    partitions in the second. Before the second move arms its switch, requests of steps past the
    first switch are served (holding them would hold the steps that move's hand-off waits for);
    a routing older than the first switch's is still refused; from the second switch on, all wait."""
    base = Routing.initial(P, ["a:1", "b:2"])
    own = PartitionOwnership(0, base)
    own.arm(10, 1)
    own.set_routing(base.moved_to(base.owners, version=1))          # the first move's hand-off
    own.set_routing(base.moved_to(base.owners, version=2))          # and its final routing
    own.expect([1])                                                  # the second move begins
    assert own.verdict(_ids_in(0), routing_version=2, step=12) is Verdict.ACCEPT
    with pytest.raises(Moved, match="routing version 1"):
        own.verdict(_ids_in(0), routing_version=0, step=12)
    own.arm(20, 3)
    assert own.verdict(_ids_in(0), routing_version=2, step=19) is Verdict.ACCEPT
    assert own.verdict(_ids_in(0), routing_version=3, step=20) is Verdict.HOLD
    own.set_routing(base.moved_to(base.owners, version=3))          # published: still holding
    assert own.verdict(_ids_in(2), routing_version=3, step=21) is Verdict.HOLD
    own.adopt([1])
    own.set_routing(base.moved_to(base.owners, version=4))
    assert own.verdict(np.concatenate([_ids_in(0), _ids_in(1)]), routing_version=3, step=25) is Verdict.ACCEPT
