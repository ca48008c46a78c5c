"""Splitting dense parameters into blocks and placing blocks on servers (DESIGN appendix A.1).

Pure functions, no I/O: every trainer and server calls ``make_plan`` with the same
inputs and must get the same ``ShardPlan``; ``ShardPlan.fingerprint`` lets them check.
Offsets and sizes are in elements of the flattened (row-major) parameter.
"""
from __future__ import annotations

import dataclasses
import heapq
import json
import math
import zlib
from typing import Sequence

from paramshard.env import DEFAULT_MIN_BLOCK_SIZE, DISPATCHERS
from paramshard.errors import ConfigError


def stable_hash(text: str) -> int:
    """crc32 of the UTF-8 text: unlike ``hash()`` it is the same in every process."""
    return zlib.crc32(text.encode("utf-8"))


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    itemsize: int = 4  # bytes per element (float32)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"parameter name {self.name!r}: give a non-empty string")
        try:
            shape = tuple(int(d) for d in self.shape)
        except (TypeError, ValueError):
            raise ConfigError(f"parameter {self.name!r}: shape {self.shape!r} is not a tuple of whole numbers") from None
        if any(d < 0 for d in shape):
            raise ConfigError(f"parameter {self.name!r}: shape {shape} has a negative dimension; "
                              "dimensions must be >= 0")
        if self.itemsize < 1:
            raise ConfigError(f"parameter {self.name!r}: itemsize {self.itemsize} must be >= 1 byte")
        object.__setattr__(self, "shape", shape)  # lists in, tuples stored: specs stay hashable

    @property
    def numel(self) -> int:
        return math.prod(self.shape)  # () -> 1: a scalar is one element


@dataclasses.dataclass(frozen=True)
class Block:
    param: str
    block_id: int
    offset: int  # elements into the flattened parameter
    size: int    # elements
    server: int

    @property
    def name(self) -> str:
        return f"{self.param}.block{self.block_id}"


@dataclasses.dataclass(frozen=True)
class ShardPlan:
    blocks: tuple[Block, ...]        # params in the order given, block ids ascending
    num_servers: int
    dispatch: str
    params: tuple[ParamSpec, ...]    # kept for itemsizes (bytes) and block shapes

    def for_server(self, server: int) -> tuple[Block, ...]:
        if not 0 <= server < self.num_servers:
            raise ConfigError(f"server {server} is not in this plan: expected 0..{self.num_servers - 1}")
        return tuple(b for b in self.blocks if b.server == server)

    def blocks_of(self, param: str) -> tuple[Block, ...]:
        self._spec(param)
        return tuple(b for b in self.blocks if b.param == param)

    def block_shape(self, block: Block) -> tuple[int, ...]:
        """Whole rows for rank >= 2 (except legacy_v1, which cuts flat); flat otherwise."""
        spec = self._spec(block.param)
        row = math.prod(spec.shape[1:])
        if len(spec.shape) < 2 or self.dispatch == "legacy_v1":
            return (block.size,)
        if row == 0:  # zero-element parameter: its single block is the whole (empty) parameter
            return spec.shape
        return (block.size // row, *spec.shape[1:])

    def server_elements(self) -> list[int]:
        out = [0] * self.num_servers
        for b in self.blocks:
            out[b.server] += b.size
        return out

    def server_bytes(self) -> list[int]:
        itemsize = {p.name: p.itemsize for p in self.params}
        out = [0] * self.num_servers
        for b in self.blocks:
            out[b.server] += b.size * itemsize[b.param]
        return out

    def load_ratio(self) -> float:
        """max/mean of server bytes; 1.0 is perfectly even. An empty plan counts as even."""
        loads = self.server_bytes()
        total = sum(loads)
        if total == 0:
            return 1.0
        return max(loads) * self.num_servers / total

    def to_json(self) -> dict:
        return {
            "blocks": [{"param": b.param, "block_id": b.block_id, "offset": b.offset,
                        "size": b.size, "server": b.server} for b in self.blocks],
            "servers": [{"server": s, "elements": n} for s, n in enumerate(self.server_elements())],
        }

    def fingerprint(self) -> int:
        """crc32 of a canonical JSON of everything that defines the plan, shapes included,
        so two processes that agree on the fingerprint hold the same blocks."""
        doc = dict(self.to_json(), dispatch=self.dispatch, num_servers=self.num_servers,
                   params=[[p.name, list(p.shape), p.itemsize] for p in self.params])
        return stable_hash(json.dumps(doc, sort_keys=True, separators=(",", ":")))

    def _spec(self, param: str) -> ParamSpec:
        for p in self.params:
            if p.name == param:
                return p
        raise ConfigError(f"parameter {param!r} is not in this plan: it holds "
                          f"{', '.join(p.name for p in self.params) or 'no parameters'}")


def slice_variable(params: Sequence[ParamSpec], slice_count: int,
                   min_block_size: int = DEFAULT_MIN_BLOCK_SIZE) -> list[tuple[str, int, int, int]]:
    """The seed algorithm (PaddlePaddle's distribute_transpiler.slice_variable), in
    integers: returns (param, block_id, offset, size) per block.

    A zero-element parameter gets one block of size 0 (the seed would divide by zero),
    so every parameter has at least one block and a name servers can register.
    """
    _check_count("slice_count", slice_count)
    _check_count("min_block_size", min_block_size)
    _check_params(params)
    out = []
    for p in params:
        numel = p.numel
        if numel == 0:
            out.append((p.name, 0, 0, 0))
            continue
        max_split = max(1, numel // min_block_size)  # blocks below min_block_size waste bandwidth
        split = min(slice_count, max_split)
        block = -(-numel // split)
        if len(p.shape) >= 2:
            row = math.prod(p.shape[1:])
            block = -(-block // row) * row  # whole rows, so a block is a plain sub-tensor
        split = -(-numel // block)  # rounding up may leave fewer blocks than asked for
        for i in range(split):
            out.append((p.name, i, i * block, min(block, numel - i * block)))
    return out


def make_plan(params: Sequence[ParamSpec], num_servers: int, dispatch: str = "round_robin",
              min_block_size: int = DEFAULT_MIN_BLOCK_SIZE,
              legacy_block_size: int | None = None) -> ShardPlan:
    """Split ``params`` and place every block on a server with the ``dispatch`` policy.

    ``legacy_block_size`` is used by ``legacy_v1`` only (None: automatic);
    ``min_block_size`` by every other dispatcher.
    """
    _check_count("num_servers", num_servers)
    _check_count("min_block_size", min_block_size)
    if dispatch not in DISPATCHERS:
        raise ConfigError(f"unknown dispatcher {dispatch!r}: use one of {', '.join(DISPATCHERS)}")
    params = tuple(params)
    _check_params(params)
    if dispatch == "legacy_v1":
        blocks = _legacy_v1(params, num_servers, legacy_block_size)
    else:
        sliced = slice_variable(params, num_servers, min_block_size)
        if dispatch == "round_robin":
            # one counter for the whole plan, so small params do not all land on server 0
            servers = [i % num_servers for i in range(len(sliced))]
        elif dispatch == "hash":
            servers = [stable_hash(f"{name}.block{bid}") % num_servers for name, bid, _, _ in sliced]
        else:
            servers = _balanced(sliced, {p.name: p.itemsize for p in params}, num_servers)
        blocks = [Block(name, bid, off, size, srv) for (name, bid, off, size), srv in zip(sliced, servers)]
    return ShardPlan(tuple(blocks), num_servers, dispatch, params)


def legacy_block_size_for(params: Sequence[ParamSpec], num_servers: int) -> int:
    """PaddlePaddle v1 ParameterClient2::calcParameterBlockSize: a power of two giving
    about 2^7 blocks per server, never below 2^10 elements."""
    per_server = sum(p.numel for p in params) // num_servers
    return 1 << max(per_server.bit_length() - 7, 10)


def _legacy_v1(params: tuple[ParamSpec, ...], num_servers: int, block_size: int | None) -> list[Block]:
    if block_size is None:
        block_size = legacy_block_size_for(params, num_servers)
    _check_count("legacy block size", block_size)
    blocks = []
    for p in params:
        name_hash = stable_hash(p.name)
        count = max(1, -(-p.numel // block_size))  # zero-element: one empty block, as in slice_variable
        for i in range(count):
            size = min(block_size, p.numel - i * block_size)
            # v1 wrote abs(...) because C++ % can be negative; crc32 is not, we keep it for fidelity
            blocks.append(Block(p.name, i, i * block_size, size, abs((i + name_hash) % num_servers)))
    return blocks


def _balanced(sliced: list[tuple[str, int, int, int]], itemsize: dict[str, int], num_servers: int) -> list[int]:
    """Greedy largest-first (LPT): each block onto the least-loaded server by bytes."""
    order = sorted(range(len(sliced)), key=lambda i: -sliced[i][3] * itemsize[sliced[i][0]])  # stable
    heap = [(0, s) for s in range(num_servers)]  # (bytes, server): ties pop the lowest server
    servers = [0] * len(sliced)
    for i in order:
        load, s = heapq.heappop(heap)
        servers[i] = s
        heapq.heappush(heap, (load + sliced[i][3] * itemsize[sliced[i][0]], s))
    return servers


def parse_shape(text: str) -> tuple[int, ...]:
    """"1000x10" -> (1000, 10); "1024" -> (1024,). Zero dimensions are allowed."""
    parts = text.strip().lower().split("x")
    dims = []
    for part in parts:
        part = part.strip()
        if part.startswith("-") and part[1:].isdigit():
            raise ConfigError(f"shape {text!r} has a negative dimension; dimensions must be >= 0")
        if not (part.isascii() and part.isdigit()):
            raise ConfigError(f"shape {text!r} is not dimensions joined by 'x', e.g. 1000x10 or 1024")
        dims.append(int(part))
    return tuple(dims)


def _check_count(what: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what} must be a whole number >= 1, got {value!r}")


def _check_params(params: Sequence[ParamSpec]) -> None:
    seen = set()
    for p in params:
        if not isinstance(p, ParamSpec):
            raise ConfigError(f"expected ParamSpec(name, shape), got {p!r}")
        if p.name in seen:
            raise ConfigError(f"parameter {p.name!r} is given twice: parameter names must be unique")
        seen.add(p.name)
