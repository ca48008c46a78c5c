"""The compiled kernels (server/storage/kernels/) against the numpy code they replace, bit for bit:
initial rows, every update rule with and without weight decay and scale, and the id index
through its incremental growth."""
import numpy as np
import pytest

from paramshard.optim import FTRL, SGD, Adagrad, Adam, Momentum
from paramshard.placement.sparse_hash import initial_rows as numpy_initial_rows
from paramshard.server.storage.kernels import arena
from paramshard.server.storage.kernels.hash_index import MAX_LOAD, MIN_DRAIN, HashIndex
from paramshard.server.storage.kernels.initial_rows import initial_rows
from paramshard.server.storage.kernels.update_kernels import rule_kernel
from paramshard.update_rules import make_rule


@pytest.mark.parametrize("dim", [1, 2, 7, 16, 33])
@pytest.mark.parametrize("seed", [0, 12345, 2**63 + 11])
def test_initial_rows_equal_the_numpy_function(dim, seed):
    ids = np.random.default_rng(dim).integers(0, 2**64 - 1, 3000, dtype=np.uint64)
    for scale in (0.01, 1.0, 3e-5):
        assert initial_rows(seed, ids, dim, scale).tobytes() == numpy_initial_rows(seed, ids, dim, scale).tobytes()


CONFIGS = [SGD(lr=0.3), SGD(lr=0.3, weight_decay=0.01),
           Momentum(lr=0.1, momentum=0.9), Momentum(lr=0.1, momentum=0.8, nesterov=True, weight_decay=0.1),
           Adagrad(lr=0.1), Adagrad(lr=0.1, lr_decay=0.05, initial_accumulator_value=0.1, weight_decay=0.01),
           Adam(lr=0.01), Adam(lr=0.02, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.01),
           FTRL(lr=0.1, l1=0.01, l2=0.1), FTRL(lr=0.1, beta=0.5, l1=0.5, weight_decay=0.1)]


@pytest.mark.parametrize("config", CONFIGS, ids=repr)
@pytest.mark.parametrize("scale", [1.0, 0.5, 1 / 3])
def test_each_rule_kernel_equals_the_numpy_rule(config, scale):
    """What the numpy store does (gather, rule.apply, scatter) and what the kernel does in place."""
    rng = np.random.default_rng(3)
    rule, dim, n = make_rule(config), 5, 200
    values = rng.standard_normal((n, dim)).astype(np.float32)
    slots = rule.init_slots((n, dim))
    steps = np.zeros(n, np.uint32) if rule.uses_step else None
    mine = [values.copy(), [s.copy() for s in slots], None if steps is None else steps.copy()]
    update = rule_kernel(rule)
    for _ in range(6):
        rows = rng.choice(n, 60, replace=False)
        grads = (rng.standard_normal((60, dim)) * rng.choice([1e-3, 1.0, 30.0])).astype(np.float32)
        # the numpy store's update (NumpyRowStore.update)
        v, s = values[rows], [x[rows] for x in slots]
        if steps is not None:
            steps[rows] += 1
            step = steps[rows][:, None]
        else:
            step = 1
        rule.apply(v, grads, s, step, scale=scale)
        values[rows] = v
        for x, new in zip(slots, s):
            x[rows] = new
        update(mine[0], mine[1], mine[2], rows.astype(np.int64), grads, scale)
    assert mine[0].tobytes() == values.tobytes()
    for got, expected in zip(mine[1], slots):
        assert got.tobytes() == expected.tobytes()


@pytest.mark.slow_unit(reason="grows and drains the index through many sizes")
def test_the_index_finds_every_id_through_growth_and_draining():
    """Ids inserted in batches while the index grows (and drains its old buckets a slice at a
    time) are all found, absent ids are not, and no batch rehashes the whole index."""
    keys = arena.reserve(1 << 22, (), np.uint64)
    index, rows, rng = HashIndex(16), 0, np.random.default_rng(5)
    all_ids = np.unique(rng.integers(1, 2**64 - 1, 700_000, dtype=np.uint64))
    rng.shuffle(all_ids)
    saw_draining, absent = False, np.arange(1, 5000, dtype=np.uint64) * np.uint64(7919)
    absent = absent[~np.isin(absent, all_ids)]
    for batch in np.array_split(all_ids, 90):
        index.make_room(keys, rows, len(batch))
        keys[rows:rows + len(batch)] = batch
        index.insert(keys, rows, len(batch))
        rows += len(batch)
        saw_draining |= index.draining
        probe = all_ids[rng.integers(0, rows, 2000)]
        np.testing.assert_array_equal(keys[index.lookup(keys, probe)], probe)
        assert (index.lookup(keys, absent) == -1).all()
        assert index.drained <= len(index.old)
    assert saw_draining, "the batches never caught the index while it drained"
    np.testing.assert_array_equal(index.lookup(keys, all_ids), np.arange(len(all_ids)))
    assert len(index.buckets) * MAX_LOAD >= rows and MIN_DRAIN > 0


def test_reserved_rows_read_zero_and_released_pages_read_zero_again():
    a = arena.reserve(1 << 20, (16,), np.float32)
    assert a.shape == (1 << 20, 16) and not a[:1000].any()
    a[:5000] = 1.0
    arena.release(a, 100)
    assert (a[:100] == 1).all() and not a[2000:5000].any()
    b = arena.grow(a, (1 << 20) + 10, 100)
    assert len(b) > 1 << 20 and (b[:100] == 1).all()
