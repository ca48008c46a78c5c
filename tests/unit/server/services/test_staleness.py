"""server/services/staleness.py: staleness of each push and the bounded-staleness gate (SSP)."""
from paramshard.server.core.barrier import Membership
from paramshard.server.services.staleness import Clocks


def test_staleness_is_how_far_the_fastest_trainer_is_ahead():
    clocks = Clocks(Membership(3, grace=5.0))
    assert [clocks.pushed(0, 0), clocks.pushed(0, 1), clocks.pushed(1, 0), clocks.pushed(2, 0)] == [0, 0, 1, 1]
    assert clocks.pushed(1, 1) == 0
    assert clocks.stats() == {0: 3, 1: 2}      # staleness -> steps (the wire writes the keys as text)


def test_the_bound_waits_for_the_slowest_required_trainer():
    membership = Membership(3, grace=5.0)
    clocks = Clocks(membership, bound=1)
    for step in range(3):
        clocks.pushed(0, step)                   # trainer 0 finished steps 0..2
    clocks.pushed(1, 0)
    assert clocks.may_start(1) and not clocks.may_start(2)
    assert clocks.laggards(2) == [2] and clocks.laggards(3) == [1, 2]
    membership.leave(2)                          # a trainer that left no longer holds anyone up
    assert clocks.may_start(2) and clocks.laggards(3) == [1]


def test_no_bound_never_waits_and_reset_forgets():
    clocks = Clocks(Membership(2, grace=5.0))
    clocks.pushed(0, 10)
    assert clocks.may_start(100) and clocks.laggards(100) == []
    clocks.reset()
    assert clocks.clock == {} and clocks.stats() == {}


def test_the_gate_asks_the_named_blocks_and_their_clocks_travel_with_them():
    clocks = Clocks(Membership(2, grace=5.0), bound=0)
    clocks.pushed(0, 0, ["a", "b"])
    clocks.pushed(1, 0, ["a"])                   # trainer 1's step 0: only block a's part so far
    assert clocks.may_start(1, ["a"]) and not clocks.may_start(1, ["a", "b"])
    assert clocks.laggards(1, ["b"]) == [1] and clocks.may_start(1)     # by trainer clocks: both did a step
    assert clocks.export(["b", "a"]) == [[[0, 1]], [[0, 1], [1, 1]]]
    new = Clocks(Membership(2, grace=5.0), bound=0)
    new.merge(["b", "a"], clocks.export(["b", "a"]))
    assert new.laggards(1, ["b"]) == [1] and new.may_start(1, ["a"]) and new.fastest() == 1
    clocks.forget(["b"])
    assert clocks.block_clock == {"a": {0: 1, 1: 1}}
