"""Which server holds each dense block, as servers are added and removed.

The ShardPlan (sharding.py) stays the pure initial placement (``initial_block_owners``); a
versioned map beside it (carried by the job's Routing, placement/partitions.py, so one object
and one version say where both sparse ids and dense blocks live) changes with each move.
``rebalance_blocks`` balances the servers' bytes while moving few blocks: each server keeps
its blocks, largest first, up to its fair share; the rest (a removed server's, or a server's
excess) goes largest first to the least-loaded server.

Pure: no I/O.
"""
from __future__ import annotations

import heapq
from typing import Mapping, Sequence

from paramshard.errors import ProtocolError
from paramshard.placement.sharding import ShardPlan

MAX_BLOCKS = 1 << 20


def initial_block_owners(plan: ShardPlan) -> dict[str, int]:
    """Every block on the server the plan put it on."""
    return {b.name: b.server for b in plan.blocks}


def block_bytes(plan: ShardPlan) -> dict[str, int]:
    itemsize = {p.name: p.itemsize for p in plan.params}
    return {b.name: b.size * itemsize[b.param] for b in plan.blocks}


def rebalance_blocks(owners: Mapping[str, int], sizes: Mapping[str, int], servers: Sequence[int]) -> dict[str, int]:
    """A new block -> server map over ``servers`` that balances bytes (``sizes``) and moves
    few blocks. Deterministic: the same inputs give the same map on every process."""
    targets = sorted(set(int(s) for s in servers))
    if not targets or targets[0] < 0:
        raise ValueError(f"rebalance_blocks: servers must be a non-empty list of indices >= 0, got {servers}")
    if set(owners) != set(sizes):
        raise ValueError("rebalance_blocks: owners and sizes must name the same blocks")
    total = sum(sizes.values())
    share = -(-total // len(targets))            # fair share, rounded up
    by_size = sorted(owners, key=lambda n: (-sizes[n], n))
    load = dict.fromkeys(targets, 0)
    new: dict[str, int] = {}
    moving = []
    for name in by_size:
        owner = owners[name]
        # A block larger than the share stays where it is (moving it would not balance anything).
        if owner in load and (load[owner] + sizes[name] <= share or load[owner] == 0):
            load[owner] += sizes[name]
            new[name] = owner
        else:
            moving.append(name)
    heap = [(load[s], s) for s in targets]
    heapq.heapify(heap)
    for name in moving:                          # largest first onto the least loaded (LPT)
        used, s = heapq.heappop(heap)
        new[name] = s
        heapq.heappush(heap, (used + sizes[name], s))
    return {name: new[name] for name in owners}


def blocks_to_wire(owners: Mapping[str, int]) -> dict:
    return {name: int(server) for name, server in sorted(owners.items())}


def blocks_from_wire(wire, addresses: Sequence[str]) -> dict[str, int]:
    """A block map read off the wire, checked: names are strings, owners live servers."""
    if not isinstance(wire, dict) or len(wire) > MAX_BLOCKS:
        raise ProtocolError(f"routing: blocks must be a map of at most {MAX_BLOCKS} block names to servers")
    for name, server in wire.items():
        if not isinstance(name, str) or type(server) is not int or not 0 <= server < len(addresses):
            raise ProtocolError(f"routing: block {name!r} -> {server!r}: expected a name and a server "
                                f"index below {len(addresses)}")
        if not addresses[server]:
            raise ProtocolError(f"routing: block {name!r} is held by a retired server ({server})")
    return dict(wire)
