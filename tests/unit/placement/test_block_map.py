"""placement/block_map.py: the dense block -> server map and its rebalancing (pure), and the
Routing that carries it on the wire."""
import numpy as np
import pytest

from paramshard.errors import ProtocolError
from paramshard.placement.block_map import block_bytes, initial_block_owners, rebalance_blocks
from paramshard.placement.partitions import Routing
from paramshard.placement.sharding import ParamSpec, make_plan


def plan(servers=2):
    return make_plan([ParamSpec("w", (4000, 8)), ParamSpec("b", (300,)), ParamSpec("v", (2000,))], servers,
                     min_block_size=256)


def loads(owners, sizes):
    out = {}
    for name, s in owners.items():
        out[s] = out.get(s, 0) + sizes[name]
    return out


def test_initial_map_is_the_plan():
    p = plan()
    assert initial_block_owners(p) == {b.name: b.server for b in p.blocks}


@pytest.mark.parametrize("servers", [[0, 1, 2], [0, 2], [0], [0, 1, 2, 3]])
def test_rebalance_balances_bytes_and_moves_only_what_it_must(servers):
    p = plan()
    owners, sizes = initial_block_owners(p), block_bytes(p)
    new = rebalance_blocks(owners, sizes, servers)
    assert set(new) == set(owners) and set(new.values()) <= set(servers)
    largest = max(sizes.values())
    share = sum(sizes.values()) / len(servers)
    assert all(load <= share + largest for load in loads(new, sizes).values())
    # A block on a kept server moves only if that server held more than its share.
    kept_over = {s for s, load in loads(owners, sizes).items() if s in servers and load > share}
    for name, s in owners.items():
        if s in servers and s not in kept_over:
            assert new[name] == s
    assert rebalance_blocks(owners, sizes, servers) == new      # deterministic


def test_rebalance_2_to_3_moves_about_a_third_and_back_keeps_the_first_servers():
    p = plan()
    owners, sizes = initial_block_owners(p), block_bytes(p)
    up = rebalance_blocks(owners, sizes, [0, 1, 2])
    moved = sum(sizes[n] for n in owners if up[n] != owners[n])
    assert 0 < moved <= sum(sizes.values()) / 3 + max(sizes.values())
    down = rebalance_blocks(up, sizes, [0, 2])
    assert 1 not in down.values()
    assert all(down[n] == up[n] for n in up if up[n] != 1)


def test_rebalance_rejects_bad_input():
    with pytest.raises(ValueError):
        rebalance_blocks({"a": 0}, {"a": 4}, [])
    with pytest.raises(ValueError):
        rebalance_blocks({"a": 0}, {"b": 4}, [0])


def test_routing_carries_the_block_map_and_checks_it():
    routing = Routing.initial(64, ["a:1", "b:2"]).moved_to(
        Routing.initial(64, ["a:1", "b:2"]).owners, blocks={"w.block0": 1, "w.block1": 0})
    back = Routing.from_wire(routing.to_wire())
    assert back.blocks == {"w.block0": 1, "w.block1": 0} and back.version == 1
    assert back.moved_to(back.owners).blocks == back.blocks
    assert Routing.from_wire({k: v for k, v in routing.to_wire().items() if k != "blocks"}).blocks == {}
    for bad in ({"w.block0": 2}, {"w.block0": "1"}, [1]):
        with pytest.raises(ProtocolError):
            Routing.from_wire({**routing.to_wire(), "blocks": bad})
    retired = {**routing.to_wire(), "addresses": ["a:1", ""], "owners": [0] * 64}
    with pytest.raises(ProtocolError, match="retired"):
        Routing.from_wire(retired)
    np.testing.assert_array_equal(back.owners, routing.owners)
