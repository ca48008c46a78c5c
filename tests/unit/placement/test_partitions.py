"""placement/partitions.py: routing by virtual partitions, and moves that shift as little as possible."""
from __future__ import annotations

import numpy as np
import pytest

from paramshard.errors import ProtocolError
from paramshard.placement.partitions import Routing, initial_owners, partition_of, rebalance
from paramshard.placement.sparse_hash import server_of

P = 256


def _balanced(owners, servers):
    counts = [int((owners == s).sum()) for s in servers]
    return max(counts) - min(counts) <= 1 and sum(counts) == len(owners)


def test_the_initial_map_of_two_servers_routes_as_the_fixed_hash():
    ids = np.random.default_rng(0).integers(0, 2**64 - 1, 10000, dtype=np.uint64)
    for servers in (1, 2, 4):
        routing = Routing.initial(P, [f"h:{i}" for i in range(servers)])
        np.testing.assert_array_equal(routing.servers_of(ids), server_of(ids, servers))
    fixed = Routing.initial(0, ["a:1", "b:2", "c:3"])
    np.testing.assert_array_equal(fixed.servers_of(ids), server_of(ids, 3))
    assert not fixed.elastic and fixed.servers() == [0, 1, 2]


def test_partitions_spread_ids_evenly():
    ids = np.arange(200000, dtype=np.uint64)
    counts = np.bincount(partition_of(ids, P), minlength=P)
    assert counts.min() > 0.8 * counts.mean() and counts.max() < 1.2 * counts.mean()


def test_two_to_three_moves_a_third_and_balances():
    before = initial_owners(P, 2)
    after = rebalance(before, [0, 1, 2])
    moved = np.flatnonzero(after != before)
    assert set(after[moved].tolist()) == {2}, "only the new server gains"
    assert len(moved) == int((after == 2).sum()) in (P // 3, P // 3 + 1)
    assert _balanced(after, [0, 1, 2])


def test_three_to_two_moves_only_the_removed_servers_partitions():
    three = rebalance(initial_owners(P, 2), [0, 1, 2])
    two = rebalance(three, [0, 1])
    moved = np.flatnonzero(two != three)
    assert set(three[moved].tolist()) == {2} and len(moved) == int((three == 2).sum())
    assert _balanced(two, [0, 1])
    assert rebalance(two, [0, 1]).tolist() == two.tolist(), "no change, no move"


def test_rebalance_is_minimal_for_any_change():
    owners = initial_owners(P, 3)
    for servers in ([0, 1, 2, 3, 4], [0, 2], [0, 1, 2, 5]):
        after = rebalance(owners, servers)
        assert _balanced(after, servers)
        # Each target keeps min(held, quota); any map within one of balance moves at least that much.
        quota_floor = P // len(servers)
        least = sum(max(0, int((owners == s).sum()) - quota_floor - 1) for s in set(owners.tolist()) if s in servers)
        least += sum(int((owners == s).sum()) for s in set(owners.tolist()) if s not in servers)
        assert int((after != owners).sum()) <= least + len(servers)
    with pytest.raises(ValueError):
        rebalance(initial_owners(4, 2), list(range(5)))


def test_routing_travels_checked():
    routing = Routing.initial(P, ["a:1", "b:2"]).moved_to(rebalance(initial_owners(P, 2), [0, 1, 2]),
                                                         addresses=["a:1", "b:2", "c:3"])
    back = Routing.from_wire(routing.to_wire())
    assert back.version == 1 and back.addresses == routing.addresses
    np.testing.assert_array_equal(back.owners, routing.owners)
    wire = routing.to_wire()
    for bad in ({**wire, "version": True}, {**wire, "owners": wire["owners"][:-1]},
                {**wire, "owners": [9] * P}, {**wire, "addresses": ["a:1", "b:2", ""]}, [1]):
        with pytest.raises(ProtocolError):
            Routing.from_wire(bad)
