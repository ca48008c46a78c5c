"""Oracles for paramshard.placement.sharding: an independent reference of the seed algorithm,
hand-computed tables, invariants for every dispatcher (cross-process stability: tests/integration/test_hash_seeds.py)."""
from __future__ import annotations

import itertools
import math
import random
from functools import reduce

import pytest

from paramshard.env import DISPATCHERS
from paramshard.errors import ConfigError
from paramshard.placement.sharding import (Block, ParamSpec, legacy_block_size_for, make_plan, parse_shape,
                                 slice_variable, stable_hash)


# ---------------------------------------------------------------------------
# (1) reference: PaddlePaddle distribute_transpiler.slice_variable, written the way
# it was (floats, math.ceil, "remains" rounding), independent of our integer version.

def reference_slice_variable(var_list, slice_count, min_block_size):
    blocks = []
    for name, shape in var_list:
        split_count = slice_count
        var_numel = reduce(lambda x, y: x * y, shape, 1)
        max_pserver_count = int(math.floor(var_numel / float(min_block_size)))
        if max_pserver_count == 0:
            max_pserver_count = 1
        if max_pserver_count < slice_count:
            split_count = max_pserver_count
        block_size = int(math.ceil(var_numel / float(split_count)))
        if len(shape) >= 2:
            # align by dim1 (width)
            dim1 = reduce(lambda x, y: x * y, shape[1:])
            remains = block_size % dim1
            if remains != 0:
                block_size += dim1 - remains
        # update split_count after aligning
        split_count = int(math.ceil(var_numel / float(block_size)))
        for block_id in range(split_count):
            curr_block_size = min(block_size, var_numel - block_id * block_size)
            blocks.append((name, block_id, block_id * block_size, curr_block_size))
    return blocks


ORACLE_SHAPES = [
    (), (1,), (7,), (8191,), (8192,), (8193,), (16384,), (10007,), (65537,), (1_000_000,),
    (1000, 10), (10, 1000), (3, 5000), (1, 100_000), (100_000, 1), (7, 13), (97, 89),
    (4096, 4096), (30_000, 16), (10, 3, 4), (2, 3, 5000), (64, 3, 3, 3), (5, 4), (1, 1, 1),
]
SLICE_COUNTS = [1, 2, 3, 4, 5, 7, 8, 16, 100]
MIN_BLOCK_SIZES = [1, 7, 1000, 8192, 65536]


@pytest.mark.parametrize("min_block_size", MIN_BLOCK_SIZES)
@pytest.mark.parametrize("slice_count", SLICE_COUNTS)
def test_slice_variable_matches_reference(slice_count, min_block_size):
    var_list = [(f"p{i}", shape) for i, shape in enumerate(ORACLE_SHAPES)]
    specs = [ParamSpec(name, shape) for name, shape in var_list]
    assert slice_variable(specs, slice_count, min_block_size) == \
        reference_slice_variable(var_list, slice_count, min_block_size)


def test_slice_variable_matches_reference_on_random_shapes():
    rng = random.Random(20240611)
    for _ in range(300):
        rank = rng.randint(1, 4)
        shape = tuple(rng.choice([1, 2, 3, rng.randint(1, 50), rng.randint(1, 3000)]) for _ in range(rank))
        count, min_bs = rng.randint(1, 12), rng.choice([1, 3, 64, 1000, 8192])
        assert slice_variable([ParamSpec("x", shape)], count, min_bs) == \
            reference_slice_variable([("x", shape)], count, min_bs), (shape, count, min_bs)


# ---------------------------------------------------------------------------
# (2) hand-computed tables: (param, block_id, offset, size)

def test_min_block_size_keeps_a_small_param_whole():
    # 1000x10 = 10000 elements; max_split = max(1, 10000 // 8192) = 1 -> one block.
    assert slice_variable([ParamSpec("w", (1000, 10))], 3, 8192) == [("w", 0, 0, 10000)]


def test_rows_rounding_1000x10_three_ways():
    # max_split = 10000 // 1000 = 10, split = 3, block = ceil(10000/3) = 3334,
    # rounded up to a multiple of 10 -> 3340; split = ceil(10000/3340) = 3;
    # sizes 3340, 3340, 10000 - 6680 = 3320.
    assert slice_variable([ParamSpec("w", (1000, 10))], 3, 1000) == [
        ("w", 0, 0, 3340), ("w", 1, 3340, 3340), ("w", 2, 6680, 3320)]


def test_prime_1d():
    # 10007 elements: max_split 10, split 4, block ceil(10007/4) = 2502; 4 * 2502 = 10008 >= 10007
    # so 4 blocks, the last 10007 - 7506 = 2501.
    assert slice_variable([ParamSpec("v", (10007,))], 4, 1000) == [
        ("v", 0, 0, 2502), ("v", 1, 2502, 2502), ("v", 2, 5004, 2502), ("v", 3, 7506, 2501)]


def test_rows_larger_than_the_block():
    # 3x5000: block ceil(15000/4) = 3750 < one row of 5000 -> 5000; split = 3: one row each.
    assert slice_variable([ParamSpec("e", (3, 5000))], 4, 1000) == [
        ("e", 0, 0, 5000), ("e", 1, 5000, 5000), ("e", 2, 10000, 5000)]


def test_alignment_can_give_fewer_blocks_than_asked():
    # 5x4 = 20, min 1, 4 asked: block 5 -> rounded to 8 (two rows); ceil(20/8) = 3 blocks: 8, 8, 4.
    assert slice_variable([ParamSpec("m", (5, 4))], 4, 1) == [
        ("m", 0, 0, 8), ("m", 1, 8, 8), ("m", 2, 16, 4)]


def test_3d_rounds_to_whole_rows_of_the_trailing_dims():
    # 10x3x4 = 120, row = 12: max_split 12, split 4, block 30 -> 36; ceil(120/36) = 4: 36, 36, 36, 12.
    assert slice_variable([ParamSpec("k", (10, 3, 4))], 4, 10) == [
        ("k", 0, 0, 36), ("k", 1, 36, 36), ("k", 2, 72, 36), ("k", 3, 108, 12)]


def test_scalar_and_zero_element_params():
    # () is one element; a zero-element param gets one empty block (documented choice).
    specs = [ParamSpec("s", ()), ParamSpec("z", (0, 10)), ParamSpec("z2", (3, 0)), ParamSpec("z3", (0,))]
    assert slice_variable(specs, 4, 1) == [("s", 0, 0, 1), ("z", 0, 0, 0), ("z2", 0, 0, 0), ("z3", 0, 0, 0)]
    plan = make_plan(specs, 2)
    assert plan.block_shape(plan.blocks_of("z")[0]) == (0, 10)
    assert plan.block_shape(plan.blocks_of("z2")[0]) == (3, 0)


def test_round_robin_one_counter_across_params():
    # a: 20000 // 8192 = 2 blocks of 10000; b: 1 block; c like a. Counter runs 0,1,2,0,1.
    plan = make_plan([ParamSpec("a", (20000,)), ParamSpec("b", (100,)), ParamSpec("c", (20000,))], 3)
    assert plan.blocks == (
        Block("a", 0, 0, 10000, 0), Block("a", 1, 10000, 10000, 1), Block("b", 0, 0, 100, 2),
        Block("c", 0, 0, 10000, 0), Block("c", 1, 10000, 10000, 1))
    assert plan.server_elements() == [20000, 20000, 100]
    assert plan.to_json() == {
        "blocks": [{"param": b.param, "block_id": b.block_id, "offset": b.offset, "size": b.size,
                    "server": b.server} for b in plan.blocks],
        "servers": [{"server": 0, "elements": 20000}, {"server": 1, "elements": 20000},
                    {"server": 2, "elements": 100}]}


def test_hash_dispatch_hand_example():
    # crc32 values checked outside Python (gzip trailer); mod 3 by digit sums:
    # fc.weight.block0 2094702946 -> 43 -> 1; block1 199070196 -> 42 -> 0;
    # block2 2463416398 -> 46 -> 1; emb.block0 3839754311 -> 44 -> 2.
    assert stable_hash("fc.weight.block0") == 2094702946
    plan = make_plan([ParamSpec("fc.weight", (4096,)), ParamSpec("emb", (100, 4))], 3, "hash", 1024)
    assert plan.blocks == (
        Block("fc.weight", 0, 0, 1366, 1), Block("fc.weight", 1, 1366, 1366, 0),
        Block("fc.weight", 2, 2732, 1364, 1), Block("emb", 0, 0, 400, 2))


# ---------------------------------------------------------------------------
# (3) invariants for every dispatcher

def random_params(rng, n):
    params = []
    for i in range(n):
        rank = rng.choice([0, 1, 1, 2, 2, 3])
        shape = tuple(rng.choice([1, 3, rng.randint(1, 300), rng.randint(1, 5000)]) for _ in range(rank))
        params.append(ParamSpec(f"layer{i}.w", shape, itemsize=rng.choice([2, 4, 8])))
    return params


@pytest.mark.parametrize("dispatch", DISPATCHERS)
def test_invariants(dispatch):
    rng = random.Random(dispatch)
    for _ in range(60):
        params = random_params(rng, rng.randint(1, 8))
        servers, min_bs = rng.randint(1, 7), rng.choice([1, 100, 8192])
        plan = make_plan(params, servers, dispatch, min_bs)
        # params in the order given, block ids ascending, each param covered exactly once
        assert [b.param for b in plan.blocks] == [p.name for p in params for _ in plan.blocks_of(p.name)]
        for p in params:
            blocks = plan.blocks_of(p.name)
            assert [b.block_id for b in blocks] == list(range(len(blocks)))
            end = 0
            for b in blocks:
                assert b.offset == end and (b.size > 0 or p.numel == 0)
                end += b.size
                if len(p.shape) >= 2 and dispatch != "legacy_v1" and p.numel:
                    row = math.prod(p.shape[1:])
                    assert b.offset % row == 0 and b.size % row == 0
                    assert math.prod(plan.block_shape(b)) == b.size
            assert end == p.numel
        assert all(0 <= b.server < servers for b in plan.blocks)
        assert sum(len(plan.for_server(s)) for s in range(servers)) == len(plan.blocks)
        assert sum(plan.server_elements()) == sum(p.numel for p in params)
        assert sum(plan.server_bytes()) == sum(p.numel * p.itemsize for p in params)
        if dispatch != "legacy_v1":  # placement never changes the blocks themselves
            assert [(b.param, b.block_id, b.offset, b.size) for b in plan.blocks] == \
                slice_variable(params, servers, min_bs)
        again = make_plan(list(params), servers, dispatch, min_bs)
        assert again == plan and again.fingerprint() == plan.fingerprint()


def test_fingerprint_sees_every_input():
    params = [ParamSpec("a", (1000, 10)), ParamSpec("b", (10,))]
    base = make_plan(params, 2, min_block_size=1000).fingerprint()
    assert make_plan(params, 3, min_block_size=1000).fingerprint() != base
    assert make_plan(params, 2, "hash", min_block_size=1000).fingerprint() != base
    assert make_plan([ParamSpec("a", (10, 1000)), params[1]], 2, min_block_size=1000).fingerprint() != base
    assert make_plan([params[0], ParamSpec("b", (10,), 8)], 2, min_block_size=1000).fingerprint() != base


# ---------------------------------------------------------------------------
# (5) legacy_v1: block size and server formula

@pytest.mark.parametrize("numels, servers, expected", [
    ([10000, 10], 2, 1024),          # 10010 // 2 = 5005, 13 bits - 7 = 6 < 10 -> 2^10
    ([1 << 24], 2, 1 << 17),         # 2^23 per server: 24 bits - 7 = 17
    ([1_000_000, 2_000_000], 3, 8192),  # 10^6 per server: 20 bits (2^19 <= 10^6 < 2^20) - 7 = 13
    ([1 << 18], 2, 2048),            # exactly 2^17 per server: 18 bits - 7 = 11
    ([0], 4, 1024),                  # nothing to split: the 2^10 floor
])
def test_legacy_block_size(numels, servers, expected):
    params = [ParamSpec(f"p{i}", (n,)) for i, n in enumerate(numels)]
    assert legacy_block_size_for(params, servers) == expected


def test_legacy_v1_hand_example():
    # block size 1024 (above); crc32("w") = 476252946 (even, and divisible by 3: digit sum 45),
    # crc32("b") = 1908338681 (odd; digit sum 47 -> 2 mod 3).
    assert (stable_hash("w"), stable_hash("b")) == (476252946, 1908338681)
    params = [ParamSpec("w", (1000, 10)), ParamSpec("b", (10,))]
    plan = make_plan(params, 2, "legacy_v1")
    assert [(b.offset, b.size, b.server) for b in plan.blocks_of("w")] == \
        [(1024 * i, 1024, i % 2) for i in range(9)] + [(9216, 784, 1)]
    assert plan.blocks_of("b") == (Block("b", 0, 0, 10, 1),)
    plan3 = make_plan(params, 3, "legacy_v1")  # 10010 // 3 = 3336: still 1024
    assert [b.server for b in plan3.blocks] == [i % 3 for i in range(10)] + [2]


def test_legacy_v1_explicit_block_size_cuts_flat_and_ignores_min_block_size():
    plan = make_plan([ParamSpec("w", (1000, 10))], 2, "legacy_v1", min_block_size=10**9, legacy_block_size=3333)
    # not row-aligned: 3333 is not a multiple of 10
    assert [(b.offset, b.size) for b in plan.blocks] == [(0, 3333), (3333, 3333), (6666, 3333), (9999, 1)]
    assert plan.block_shape(plan.blocks[1]) == (3333,)


# ---------------------------------------------------------------------------
# (6) balanced

def test_balanced_hand_example():
    # one block each (min block huge), in units of 10k elements a=3, b=2, c=2, d=1.
    # Largest first: a->0 (tie, lowest), b->1, c->1 (2 < 3), d->0 (3 < 4): loads 4, 4.
    params = [ParamSpec("a", (30000,)), ParamSpec("b", (20000,)), ParamSpec("c", (20000,)), ParamSpec("d", (10000,))]
    plan = make_plan(params, 2, "balanced", min_block_size=10**9)
    assert [b.server for b in plan.blocks] == [0, 1, 1, 0]
    assert plan.server_elements() == [40000, 40000]
    assert plan.load_ratio() == 1.0
    # round robin: a, c -> 0 and b, d -> 1 = 5 vs 3, ratio 5 / 4
    assert make_plan(params, 2, min_block_size=10**9).load_ratio() == 1.25


def test_balanced_counts_bytes_not_elements():
    # bytes: a 8000, b 6000, c 4800 -> a:0, b:1, c:1. By elements (b 1500 > c 1200 > a 1000)
    # it would have been b:0, c:1, a:1.
    params = [ParamSpec("a", (1000,), 8), ParamSpec("b", (1500,)), ParamSpec("c", (1200,))]
    plan = make_plan(params, 2, "balanced", min_block_size=10**9)
    assert [b.server for b in plan.blocks] == [0, 1, 1]
    assert plan.server_bytes() == [8000, 10800]


def test_balanced_ties_keep_order_and_lowest_server():
    plan = make_plan([ParamSpec(n, (100,)) for n in "abcd"], 3, "balanced", min_block_size=10**9)
    assert [b.server for b in plan.blocks] == [0, 1, 2, 0]


@pytest.mark.parametrize("params, servers", [
    ([ParamSpec("big", (100_000,))] + [ParamSpec(f"small{i}", (100,)) for i in range(20)], 4),
    ([ParamSpec("emb", (50_000, 64)), ParamSpec("fc1", (64, 64)), ParamSpec("fc1.b", (64,)),
      ParamSpec("out", (64, 1)), ParamSpec("out.b", (1,))], 3),
    ([ParamSpec("l1", (784, 512)), ParamSpec("b1", (512,)), ParamSpec("l2", (512, 512)),
      ParamSpec("b2", (512,)), ParamSpec("l3", (512, 10)), ParamSpec("b3", (10,))], 3),
    ([ParamSpec(f"w{i}", (9000 * (i + 1),)) for i in range(7)], 5),
])
def test_balanced_no_worse_than_round_robin_on_skewed_models(params, servers):
    assert make_plan(params, servers, "balanced").load_ratio() <= make_plan(params, servers).load_ratio()


def test_balanced_fixes_round_robins_worst_case():
    # A small MLP on 2 servers: each 64x64 weight (4096 < 8192) and each bias is one block,
    # so the round-robin counter puts every weight on server 0 and every bias on server 1.
    params = [p for i in range(4) for p in (ParamSpec(f"fc{i}.w", (64, 64)), ParamSpec(f"fc{i}.b", (64,)))]
    rr, bal = make_plan(params, 2), make_plan(params, 2, "balanced")
    assert rr.server_elements() == [4 * 4096, 4 * 64]
    assert rr.load_ratio() == pytest.approx(2 * 4096 / 4160)
    # balanced: weights alternate 0, 1, 0, 1, then biases fill the gaps -> exactly even
    assert bal.server_elements() == [2 * 4096 + 2 * 64] * 2 and bal.load_ratio() == 1.0


def test_balanced_within_grahams_bound_of_the_optimum():
    # LPT guarantees max load <= (4/3 - 1/(3m)) * optimum; the optimum by brute force.
    rng = random.Random(7)
    for _ in range(40):
        servers = rng.randint(2, 3)
        params = [ParamSpec(f"p{i}", (rng.randint(1, 1000),)) for i in range(rng.randint(2, 7))]
        plan = make_plan(params, servers, "balanced", min_block_size=10**9)
        sizes = [p.numel * 4 for p in params]
        optimum = min(max(sum(s for s, a in zip(sizes, assign) if a == k) for k in range(servers))
                      for assign in itertools.product(range(servers), repeat=len(sizes)))
        assert max(plan.server_bytes()) <= (4 / 3 - 1 / (3 * servers)) * optimum
        # and the list-scheduling bound: no server above the mean plus one largest block
        assert max(plan.server_bytes()) <= sum(sizes) / servers + max(sizes)


def test_load_ratio_edge_cases():
    assert make_plan([], 3).load_ratio() == 1.0
    assert make_plan([ParamSpec("z", (0,))], 3).load_ratio() == 1.0
    assert make_plan([], 2).to_json() == {"blocks": [], "servers": [{"server": 0, "elements": 0},
                                                                    {"server": 1, "elements": 0}]}
    # one block on three servers: max/mean = 3
    assert make_plan([ParamSpec("a", (10,))], 3).load_ratio() == 3.0


# ---------------------------------------------------------------------------
# (7) bad input says what to do

@pytest.mark.parametrize("kwargs, message", [
    (dict(num_servers=0), "num_servers must be a whole number >= 1"),
    (dict(num_servers=-2), "num_servers must be"),
    (dict(num_servers=2, min_block_size=0), "min_block_size must be"),
    (dict(num_servers=2, dispatch="random"), "use one of round_robin, hash, legacy_v1, balanced"),
    (dict(num_servers=2, dispatch="legacy_v1", legacy_block_size=0), "legacy block size must be"),
])
def test_make_plan_rejects_bad_config(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        make_plan([ParamSpec("a", (10,))], **kwargs)


def test_bad_params_are_rejected():
    with pytest.raises(ConfigError, match="given twice"):
        make_plan([ParamSpec("a", (10,)), ParamSpec("a", (3,))], 2)
    with pytest.raises(ConfigError, match="negative dimension"):
        ParamSpec("a", (10, -1))
    with pytest.raises(ConfigError, match="non-empty"):
        ParamSpec("", (10,))
    with pytest.raises(ConfigError, match="slice_count must be"):
        slice_variable([ParamSpec("a", (10,))], 0)
    plan = make_plan([ParamSpec("a", (10,))], 2)
    with pytest.raises(ConfigError, match="expected 0..1"):
        plan.for_server(2)
    with pytest.raises(ConfigError, match="it holds a"):
        plan.blocks_of("nope")


@pytest.mark.parametrize("text, shape", [
    ("1000x10", (1000, 10)), ("1024", (1024,)), ("10x3x4", (10, 3, 4)), ("0x3", (0, 3)), (" 5 X 7 ", (5, 7)),
])
def test_parse_shape(text, shape):
    assert parse_shape(text) == shape


@pytest.mark.parametrize("text", ["", "10x", "x10", "a", "1.5", "1e3", "10x-3", "-3", "+3", "10,3", "\u0663"])
def test_parse_shape_rejects(text):
    with pytest.raises(ConfigError, match="shape"):
        parse_shape(text)
