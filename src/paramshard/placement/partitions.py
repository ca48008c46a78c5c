"""Routing of sparse ids by virtual partitions, so servers can be added and removed.

An id's partition is ``mix64(id ^ salt) % P`` (P fixed for the job, PARAMSHARD_PARTITIONS); a
versioned map says which server owns each partition. A change of server count moves only
whole partitions, and as few as possible (``rebalance``), so rows, not the hash, decide what
travels. ``P = 0`` is the fixed routing of jobs that never scale: ``mix64(id ^ salt) % S``
(placement/sparse_hash.server_of). With P a power of two and S dividing it, the initial map
(``p % S``) gives every id the same owner as the fixed routing.

Pure: no I/O. The routing travels as a small dict (``to_wire`` / ``from_wire``, checked).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from paramshard.errors import ProtocolError
from paramshard.placement.block_map import blocks_from_wire, blocks_to_wire
from paramshard.placement.sparse_hash import _SALT_SERVER, mix64, server_of

MAX_PARTITIONS = 1 << 20


def partition_of(ids: np.ndarray, partitions: int) -> np.ndarray:
    """The virtual partition of each id (int64)."""
    return (mix64(np.asarray(ids, np.uint64) ^ _SALT_SERVER) % np.uint64(partitions)).astype(np.int64)


def initial_owners(partitions: int, servers: int) -> np.ndarray:
    """Partition p on server p % S: balanced within one partition."""
    return (np.arange(partitions, dtype=np.int64) % servers).astype(np.int32)


def rebalance(owners: np.ndarray, servers: list[int]) -> np.ndarray:
    """A new owner map over ``servers`` (server indices) that moves as few partitions as possible:
    each target keeps up to its quota (P // n, one more for the P % n targets holding most now),
    the rest (excess, or a removed server's) goes to the targets under quota, lowest index first."""
    owners = np.asarray(owners, np.int32)
    targets = sorted(set(int(s) for s in servers))
    if not targets or targets[0] < 0:
        raise ValueError(f"rebalance: servers must be a non-empty list of indices >= 0, got {servers}")
    p, n = len(owners), len(targets)
    if p < n:
        raise ValueError(f"{p} partitions cannot spread over {n} servers; raise PARAMSHARD_PARTITIONS")
    held = {s: int((owners == s).sum()) for s in targets}
    by_holding = sorted(targets, key=lambda s: (-held[s], s))
    quota = {s: p // n + (1 if i < p % n else 0) for i, s in enumerate(by_holding)}
    kept = dict.fromkeys(targets, 0)
    new = owners.copy()
    moving = []
    for part, owner in enumerate(owners.tolist()):
        if owner in kept and kept[owner] < quota[owner]:
            kept[owner] += 1
        else:
            moving.append(part)
    spots = [s for s in targets for _ in range(quota[s] - kept[s])]
    new[np.asarray(moving, np.int64)] = np.asarray(spots, np.int32)
    return new


@dataclasses.dataclass(frozen=True)
class Routing:
    """Who owns which ids, at ``version``. ``addresses``: host:port of every server index the
    job ever had ("" for a retired one). ``partitions == 0``: the fixed routing over
    ``len(addresses)`` servers, which never changes."""
    version: int
    partitions: int
    owners: np.ndarray            # int32 [partitions]: the server of each partition
    addresses: tuple[str, ...]
    # Dense block name -> server (placement/block_map.py); empty until server 0 learns the
    # plan (the chief's register_dense), and in jobs without dense parameters.
    blocks: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def initial(cls, partitions: int, addresses) -> "Routing":
        addresses = tuple(addresses)
        owners = initial_owners(partitions, len(addresses)) if partitions else np.zeros(0, np.int32)
        return cls(0, partitions, owners, addresses)

    @property
    def elastic(self) -> bool:
        return self.partitions > 0

    def servers(self) -> list[int]:
        """Servers owning at least one partition (every server under the fixed routing)."""
        if not self.elastic:
            return list(range(len(self.addresses)))
        return sorted(set(self.owners.tolist()))

    def servers_of(self, ids: np.ndarray) -> np.ndarray:
        """Owner server of each id (int64)."""
        if not self.elastic:
            return server_of(ids, len(self.addresses))
        return self.owners[partition_of(ids, self.partitions)].astype(np.int64)

    def moved_to(self, owners: np.ndarray, version: int | None = None,
                 addresses=None, blocks=None) -> "Routing":
        return Routing(self.version + 1 if version is None else version, self.partitions,
                       np.asarray(owners, np.int32).copy(), tuple(addresses or self.addresses),
                       dict(self.blocks if blocks is None else blocks))

    def block_servers(self) -> list[int]:
        """Servers holding at least one dense block."""
        return sorted(set(self.blocks.values()))

    def to_wire(self) -> dict:
        return {"version": self.version, "partitions": self.partitions,
                "owners": self.owners.astype(int).tolist(), "addresses": list(self.addresses),
                "blocks": blocks_to_wire(self.blocks)}

    @classmethod
    def from_wire(cls, wire) -> "Routing":
        """A routing read off the wire, checked before it is used."""
        if not isinstance(wire, dict):
            raise ProtocolError(f"routing must be a map, got {type(wire).__name__}")
        version, partitions = wire.get("version"), wire.get("partitions")
        owners, addresses = wire.get("owners"), wire.get("addresses")
        if type(version) is not int or version < 0 or type(partitions) is not int or \
                not 0 <= partitions <= MAX_PARTITIONS:
            raise ProtocolError(f"routing: version and partitions must be ints >= 0 (partitions <= "
                                f"{MAX_PARTITIONS}), got {version!r}, {partitions!r}")
        if not isinstance(addresses, list) or not addresses or not all(isinstance(a, str) for a in addresses):
            raise ProtocolError("routing: addresses must be a non-empty list of strings")
        if not isinstance(owners, list) or len(owners) != partitions or \
                not all(type(o) is int and 0 <= o < len(addresses) for o in owners):
            raise ProtocolError(f"routing: owners must be {partitions} server indices below {len(addresses)}")
        if any(not addresses[o] for o in set(owners)):
            raise ProtocolError("routing: a partition is owned by a retired server (empty address)")
        blocks = blocks_from_wire(wire.get("blocks", {}), addresses)
        return cls(version, partitions, np.asarray(owners, np.int32), tuple(addresses), blocks)
