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
