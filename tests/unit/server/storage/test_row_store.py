"""The RowStore contract (server/storage/row_store.py): the numpy and the compiled store, each against a
dict-and-loop oracle, call for call, for every update rule and row format (float32; float16 and bfloat16
rounded to nearest or stochastically); the one creation path's all-or-nothing; snapshot pages
that restore into an equal store; what stochastic rounding keeps of updates smaller than a gap."""
import numpy as np

import paramshard as ps
import pytest

from paramshard.optim import FTRL, SGD, Adagrad, Adam, Momentum, RowWiseAdagrad, scaled
from paramshard.server.core.barrier import Membership
from paramshard.server.storage.compiled_row_store import CompiledRowStore
from paramshard.server.storage.numpy_row_store import NumpyRowStore
from paramshard.server.storage.row_formats import rounded
from paramshard.server.storage.sparse_table import SparseTable
from paramshard.placement.sparse_hash import initial_rows
from paramshard.tables import Admission, Eviction
from paramshard.update_rules import make_rule

from tests.unit.reference_row_store import DictRowStore

DIM = 3
RULES = [SGD(lr=0.5), Momentum(lr=0.1, momentum=0.9), Adagrad(lr=0.1, lr_decay=0.01), Adam(lr=0.01),
         FTRL(lr=0.1, l1=0.01), RowWiseAdagrad(lr=0.1, initial_accumulator_value=0.1, weight_decay=0.01)]


STORES = [NumpyRowStore, CompiledRowStore]
each_store = pytest.mark.parametrize("kind", STORES, ids=lambda k: k.__name__)
FORMATS = [("float32", "nearest"), ("float16", "nearest"), ("bfloat16", "nearest"), ("float16", "stochastic"),
           ("bfloat16", "stochastic")]
each_format = pytest.mark.parametrize("row_format", FORMATS, ids=lambda f: f"{f[0]}-{f[1]}")


def stores(optimizer, keep_last_seen=True, count=True, capacity=4, kind=NumpyRowStore, dim=DIM,
           row_format=("float32", "nearest"), seed=0):
    rule = make_rule(optimizer)
    fmt = {"value_dtype": row_format[0], "rounding": row_format[1], "seed": seed}
    return (kind(dim, rule, keep_last_seen, count, max_rows=10**6, capacity=capacity, **fmt),
            DictRowStore(dim, rule, keep_last_seen, count, **fmt))


def same(a, b):
    assert a.num_rows == b.num_rows
    pa, pb = a.page(0, a.num_rows + 1), b.page(0, b.num_rows + 1)
    assert list(pa) == list(pb)
    for name in pa:
        np.testing.assert_array_equal(pa[name], pb[name], err_msg=name)


@each_store
@each_format
@pytest.mark.parametrize("optimizer", RULES, ids=lambda o: o.kind)
def test_each_store_matches_the_oracle_call_for_call(optimizer, row_format, kind):
    rng = np.random.default_rng(7)
    fast, oracle = stores(optimizer, kind=kind, row_format=row_format, seed=21)
    for version in range(40):
        ids = np.unique(rng.integers(0, 60, 12).astype(np.uint64))
        grads = rng.standard_normal((len(ids), DIM)).astype(np.float32)
        pulled = rng.permutation(np.repeat(ids, 2))       # repeats, in no order
        for store in (fast, oracle):
            if version % 2:               # the two ways a row is made
                new = ids[store.lookup(ids) < 0]
                if len(new):
                    store.create(new, initial_rows(5, new, DIM, 0.1), version)
            else:
                store.lookup_or_create(pulled, version, 5, 0.1)
            rows = store.lookup(ids)
            store.touch(rows[::2], version)
            store.update(rows, grads, scale=0.5, version=version)
        np.testing.assert_array_equal(fast.lookup(ids), oracle.lookup(ids))
        np.testing.assert_array_equal(fast.gather(fast.lookup(ids)), oracle.gather(oracle.lookup(ids)))
        np.testing.assert_array_equal(fast.count(ids[:3]), oracle.count(ids[:3]))
        np.testing.assert_array_equal(fast.counted(ids), oracle.counted(ids))
        if version % 7 == 6:                 # handles change: compare through lookups and pages
            assert fast.evict_unseen(version - 5) == oracle.evict_unseen(version - 5)
        same(fast, oracle)
        np.testing.assert_array_equal(fast.ids(), oracle.ids())
    assert 0 < fast.num_rows < 60            # some rows were evicted, some kept
    fast_ids, fast_counts = fast.counters()
    oracle_ids, oracle_counts = oracle.counters()
    assert fast_ids.tolist() == oracle_ids.tolist()
    np.testing.assert_array_equal(fast_counts, oracle_counts)


@each_store
def test_a_page_restores_into_an_equal_store_and_imports_keep_state(kind):
    fast, _ = stores(Adam(lr=0.01), kind=kind)
    ids = np.arange(10, 20, dtype=np.uint64)
    fast.create(ids, initial_rows(1, ids, DIM, 0.1), version=3)
    fast.update(fast.lookup(ids[:4]), np.ones((4, DIM), np.float32), scale=1.0)
    fast.count(ids[:2])
    page = fast.page(0, 100)
    copy, _ = stores(Adam(lr=0.01), kind=kind)
    copy.create(page.pop("ids"), page.pop("values"), version=0, state=page)
    copy.restore_counts(*fast.counters())
    same(fast, copy)
    np.testing.assert_array_equal(copy.counters()[1], fast.counters()[1])
    rows = copy.lookup(ids[:2])
    copy.set_values(rows, np.zeros((2, DIM), np.float32))
    assert (copy.gather(rows) == 0).all() and (copy.page(0, 2)["steps"] == 1).all()   # state kept


@each_store
def test_a_failed_create_leaves_the_store_as_it_was(monkeypatch, kind):
    fast, _ = stores(SGD(), capacity=2, kind=kind)
    fast.create(np.array([1, 2], np.uint64), np.ones((2, DIM), np.float32), 0)

    def fail(*args):
        raise MemoryError("simulated")
    monkeypatch.setattr(fast.index, "insert", fail)
    with pytest.raises(MemoryError):
        fast.create(np.array([3, 4, 5], np.uint64), np.ones((3, DIM), np.float32), 0)
    assert fast.num_rows == 2 and (fast.lookup(np.array([3, 4, 5], np.uint64)) == -1).all()
    same(fast, fast)


@each_store
def test_reserve_creates_nothing_and_clear_drops_everything(kind):
    fast, _ = stores(Adagrad(lr=0.1), kind=kind)
    fast.reserve(5000)
    assert fast.num_rows == 0 and len(fast.values) >= 5000
    fast.create(np.array([7], np.uint64), np.ones((1, DIM), np.float32), 0)
    fast.count(np.array([9], np.uint64))
    fast.clear()
    assert fast.num_rows == 0 and fast.counters()[0].size == 0 and fast.lookup(np.array([7], np.uint64))[0] == -1


@each_store
@pytest.mark.parametrize("optimizer", RULES, ids=lambda o: o.kind)
def test_a_new_rule_updates_rows_from_the_next_update_on(optimizer, kind):
    """set_rule (a learning-rate change, server/services/learning_rates.py): the same state, another rate."""
    rng = np.random.default_rng(5)
    fast, oracle = stores(optimizer, kind=kind)
    ids = np.arange(1, 9, dtype=np.uint64)
    for store in (fast, oracle):
        store.create(ids, initial_rows(3, ids, DIM, 0.1), 0)
    for version, lr_scale in enumerate([1.0, 1.0, 0.25, 0.25, 3.0]):
        grads = rng.standard_normal((len(ids), DIM)).astype(np.float32)
        for store in (fast, oracle):
            if lr_scale != 1.0:
                store.set_rule(make_rule(scaled(optimizer, lr_scale)))
            store.update(store.lookup(ids), grads, scale=0.5, version=version)
        same(fast, oracle)
    with pytest.raises(ValueError, match="keeps other state"):
        fast.set_rule(make_rule(FTRL() if optimizer.kind != "ftrl" else SGD()))


def test_both_stores_offer_every_member_of_the_contract():
    from paramshard.server.storage.row_store import RowStore
    members = {name for name in vars(RowStore) if not name.startswith("_")} | set(RowStore.__annotations__)
    assert {"create", "lookup", "gather", "update", "evict_unseen", "page", "clear"} <= members
    for store in (*stores(SGD()), *stores(SGD(), kind=CompiledRowStore)):
        missing = [name for name in members if not hasattr(store, name)]
        assert missing == [], f"{type(store).__name__} lacks {missing}"


@each_store
@pytest.mark.parametrize("optimizer", RULES, ids=lambda o: o.kind)
def test_drop_and_state_of_match_the_oracle(optimizer, kind):
    """A partition that moved away (server/elastic/migration_service.py): its rows go, the rest keep their
    order and state; ``state_of`` reads any rows' state as a page does."""
    rng = np.random.default_rng(3)
    fast, oracle = stores(optimizer, kind=kind)
    ids = np.unique(rng.integers(0, 500, 80).astype(np.uint64))
    for store in (fast, oracle):
        store.create(ids, rng.standard_normal((len(ids), DIM)).astype(np.float32) * 0 + 1, version=2)
    grads = rng.standard_normal((len(ids), DIM)).astype(np.float32)
    for store in (fast, oracle):
        store.update(store.lookup(ids), grads, scale=0.5, version=3)
    picked = rng.permutation(len(ids))[:17]
    for name, a in fast.state_of(fast.lookup(ids[picked])).items():
        np.testing.assert_array_equal(a, oracle.state_of(oracle.lookup(ids[picked]))[name], err_msg=name)
    gone = np.concatenate([ids[::3], np.array([10**12], np.uint64)])      # one without a row
    assert fast.drop(gone) == oracle.drop(gone) == len(ids[::3])
    same(fast, oracle)
    assert (fast.lookup(ids[::3]) == -1).all()
    fresh = np.array([10**12 + 1], np.uint64)           # rows can still be made after a drop
    for store in (fast, oracle):
        store.create(fresh, np.ones((1, DIM), np.float32), version=4)
    same(fast, oracle)


@each_store
@pytest.mark.parametrize("optimizer", RULES, ids=lambda o: o.kind)
def test_set_state_makes_a_row_again_in_place_as_create_would(optimizer, kind):
    """A moved partition's row arriving again (server/elastic/partition_intake.py): ``set_values`` and
    ``set_state`` write it over in place, given parts as given, the others fresh, as ``create``
    makes a row; its handle stays."""
    rng = np.random.default_rng(5)
    fast, oracle = stores(optimizer, kind=kind)
    ids = np.unique(rng.integers(0, 500, 60).astype(np.uint64))
    grads = rng.standard_normal((len(ids), DIM)).astype(np.float32)
    for store in (fast, oracle):
        store.create(ids, np.ones((len(ids), DIM), np.float32), version=2)
        store.update(store.lookup(ids), grads, 0.5, 3)
    again = ids[::2]
    page = fast.state_of(fast.lookup(again))
    page = {name: (a + 1).astype(a.dtype) for name, a in page.items()}
    partial = {name: a for name, a in page.items() if name != "slot0"}       # slot0 left out: fresh
    handles = fast.lookup(again)
    for store in (fast, oracle):
        store.set_values(store.lookup(again), np.full((len(again), DIM), 7, np.float32))
        store.set_state(store.lookup(again), 9, partial)
    assert (fast.lookup(again) == handles).all(), "rows made again in place keep their handles"
    same(fast, oracle)
    written = fast.state_of(handles)
    for name in partial:
        np.testing.assert_array_equal(written[name], partial[name], err_msg=name)


@pytest.mark.slow_unit(reason="many growths of every store, checked against the oracle after each")
@each_store
def test_drops_between_growths_and_first_touches_keep_every_handle_right(kind):
    """Drops cost per id dropped (row_store.swap_plan): the index forgets ids (MOVED / tombstone
    buckets) and repoints the rows moved into the gaps, while it grows, drains and takes new ids
    (first touches and creates, a small capacity so the buckets grow often). Call for call, the
    store equals the one-row-at-a-time oracle, and every id ever made is found exactly where it is."""
    rng = np.random.default_rng(11)
    fast, oracle = stores(ps.optim.Adagrad(lr=0.1), kind=kind, capacity=4)
    alive: set[int] = set()
    for round_ in range(60):
        new = np.unique(rng.integers(0, 5000, int(rng.integers(1, 300))).astype(np.uint64))
        if round_ % 2:
            for store in (fast, oracle):
                store.lookup_or_create(new, round_, seed=3, init_scale=0.1)
        else:
            new = new[~np.isin(new, np.fromiter(alive, np.uint64, len(alive)))]
            for store in (fast, oracle):
                store.create(new, np.full((len(new), DIM), round_, np.float32), version=round_)
        alive |= set(new.tolist())
        known = np.fromiter(alive, np.uint64, len(alive))
        gone = rng.choice(known, int(rng.integers(0, len(known) // 2 + 1)), replace=False)
        gone = np.concatenate([gone, gone[:3], np.array([10**15], np.uint64)])   # repeats, one never made
        assert fast.drop(gone) == oracle.drop(gone) == len(np.unique(gone)) - 1
        alive -= set(gone.tolist())
        same(fast, oracle)
        everything = np.arange(5000, dtype=np.uint64)
        np.testing.assert_array_equal(fast.lookup(everything), oracle.lookup(everything))
        rows = fast.lookup(np.fromiter(alive, np.uint64, len(alive)))
        assert sorted(rows.tolist()) == list(range(len(alive))), "a live id lost its row or shares one"
        fast.update(rows[:50], np.ones((len(rows[:50]), DIM), np.float32), scale=1.0, version=round_)
        oracle.update(oracle.lookup(np.fromiter(alive, np.uint64, len(alive)))[:50],
                      np.ones((len(rows[:50]), DIM), np.float32), scale=1.0, version=round_)
    same(fast, oracle)


@pytest.mark.parametrize("mode, trainers, admission, eviction", [
    ("async", 1, Admission(min_count=2), Eviction(unseen_steps=6)),
    ("sync", 2, Admission(probability=0.7), Eviction()),
    ("sync", 2, Admission(min_count=3, probability=0.8), Eviction(unseen_steps=4)),
])
@each_store
def test_a_table_gives_the_same_rows_on_either_store(mode, trainers, admission, eviction, kind):
    """The table reaches its rows only through the contract: over the oracle store it pulls
    exactly what it pulls over the numpy store, through admission, eviction and sync steps."""
    def table(store):
        return SparseTable("t", DIM, 11, Adam(lr=0.01), admission, eviction, 0.1, mode,
                           Membership(trainers, grace=5.0), store=store)
    fast, oracle = table(kind), table(DictRowStore)
    rng = np.random.default_rng(1)
    for step in range(25):
        for trainer in range(trainers):
            ids = rng.integers(0, 150, 30).astype(np.uint64)
            pulled = [t.pull(ids, trainer=trainer) for t in (fast, oracle)]
            np.testing.assert_array_equal(*pulled)
            distinct = np.unique(ids)
            grads = rng.standard_normal((len(distinct), DIM)).astype(np.float32)
            for t in (fast, oracle):
                t.push(trainer, step, distinct, grads, distinct=True)
    assert (fast.num_rows, fast.version, fast.evicted) == (oracle.num_rows, oracle.version, oracle.evicted)
    for got, expected in zip(fast.export(), oracle.export()):
        np.testing.assert_array_equal(got, expected)
    probe = np.arange(200, dtype=np.uint64)
    np.testing.assert_array_equal(fast.pull(probe, create=False), oracle.pull(probe, create=False))


@each_store
@pytest.mark.parametrize("dim", [1, 8, 9, 16, 37])
@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_rowwise_adagrad_rows_are_bit_identical_to_the_scalar_oracle(dim, scale, kind):
    """The numpy rule against the oracle's one-float32-at-a-time loop in the documented order, at
    widths where numpy's pairwise sum would add in another order (> 8 columns), through growth,
    eviction and a page restored into a new store."""
    optimizer = RowWiseAdagrad(lr=0.05, eps=1e-8, initial_accumulator_value=0.01, weight_decay=0.001)
    fast, oracle = stores(optimizer, capacity=2, dim=dim, kind=kind)
    rng = np.random.default_rng(dim)
    for version in range(12):
        ids = np.unique(rng.integers(0, 40, 15).astype(np.uint64))
        grads = (rng.standard_normal((len(ids), dim)) * 10.0 ** rng.integers(-3, 3, (len(ids), 1))).astype(np.float32)
        for store in (fast, oracle):
            new = ids[store.lookup(ids) < 0]
            if len(new):
                store.create(new, initial_rows(3, new, dim, 0.1), version)
            rows = store.lookup(ids)
            store.touch(rows, version)
            store.update(rows, grads, scale=scale)
        if version == 8:
            assert fast.evict_unseen(version - 2) == oracle.evict_unseen(version - 2)
        same(fast, oracle)
    page = fast.page(0, fast.num_rows)
    assert page["slot0"].shape == (fast.num_rows, 1) and "steps" not in page     # one float per row, no counts
    copy, _ = stores(optimizer, dim=dim, kind=kind)
    copy.create(page.pop("ids"), page.pop("values"), version=0, state=page)
    same(fast, copy)


def test_rowwise_adagrad_keeps_one_float_of_state_per_row():
    dim, capacity = 16, 1000
    per_element, _ = stores(Adagrad(lr=0.1), keep_last_seen=False, count=False, capacity=capacity, dim=dim)
    per_row, _ = stores(RowWiseAdagrad(lr=0.1), keep_last_seen=False, count=False, capacity=capacity, dim=dim)
    assert [s.shape for s in per_row.slots] == [(capacity, 1)]
    assert per_element.nbytes - per_row.nbytes == capacity * (dim - 1) * 4      # 64 bytes of state a row -> 4
    per_row.reserve(5000)                                                        # grows like the values
    assert [s.shape for s in per_row.slots] == [(len(per_row.values), 1)]


def test_the_compiled_store_keeps_a_dim_16_rowwise_row_in_76_bytes_plus_its_index():
    store, _ = stores(RowWiseAdagrad(lr=0.1), keep_last_seen=False, count=False, kind=CompiledRowStore, dim=16)
    assert store.bytes_per_row == 8 + 64 + 4               # id, values, one accumulator
    for batch in np.array_split(np.arange(1, 200_001, dtype=np.uint64), 20):   # filled by pulls
        store.lookup_or_create(batch, 0, 1, 0.1)
    while store.index.draining:                   # growth's old buckets go as later calls drain them
        store.lookup(batch[:10])
    assert store.nbytes / store.num_rows <= 76 + 8 / 0.375 + 0.5     # the index: at most 21.3 bytes a row


@each_store
@pytest.mark.parametrize("row_format", FORMATS[1:], ids=lambda f: f"{f[0]}-{f[1]}")
def test_half_rows_go_in_rounded_and_come_out_as_stored(row_format, kind):
    """create, set_values and restored pages round float32 values to the format (to nearest, whatever
    the update rounding); gather and pages give the stored values exactly, as float32."""
    dtype = row_format[0]
    fast, oracle = stores(Adam(lr=0.01), kind=kind, row_format=row_format)
    ids = np.arange(1, 9, dtype=np.uint64)
    given = np.random.default_rng(2).standard_normal((8, DIM)).astype(np.float32) * np.float32(1e-3)
    given[0] = [65519.0, -1e-7, 3e-8]           # float16: the largest value rounding down, subnormals
    for store in (fast, oracle):
        store.create(ids, given, version=0)
    expected = rounded(given, dtype)
    assert not np.array_equal(expected, given)
    rows = fast.lookup(ids)
    np.testing.assert_array_equal(fast.gather(rows), expected)
    np.testing.assert_array_equal(fast.page(0, 8)["values"], expected)
    assert fast.gather(rows).dtype == np.float32 and fast.page(0, 8)["values"].dtype == np.float32
    fast.set_values(rows[:2], given[2:4])
    oracle.set_values(oracle.lookup(ids[:2]), given[2:4])
    np.testing.assert_array_equal(fast.gather(rows[:2]), expected[2:4])
    same(fast, oracle)
    page = fast.page(0, 8)
    copy, _ = stores(Adam(lr=0.01), kind=kind, row_format=row_format)
    copy.create(page.pop("ids"), page.pop("values"), version=0, state=page)      # exact: no second rounding
    same(fast, copy)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_stochastic_rounding_keeps_updates_smaller_than_a_gap_on_average(dtype):
    """100 SGD steps of an eighth of the format's gap from 1.5: rounded to nearest, every step is lost;
    rounded stochastically, each value moves by whole gaps at random and their mean follows the
    float32 table; both stores give the same rows, and another seed other rows."""
    gap = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}[dtype]       # between 1 and 2
    n, dim = 2000, 4
    ids = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    grads = np.full((n, dim), gap / 8, np.float32)

    def train(kind, value_dtype, rounding, seed=5):
        store = kind(dim, make_rule(SGD(lr=1.0)), False, False, max_rows=10**6, capacity=n,
                     value_dtype=value_dtype, rounding=rounding, seed=seed)
        rows = store.create(ids, np.full((n, dim), 1.5, np.float32), version=0)
        for version in range(100):
            store.update(rows, grads, scale=1.0, version=version)
        return store.gather(rows)

    exact = train(NumpyRowStore, "float32", "nearest")
    assert (exact == 1.5 - 12.5 * gap).all()                       # float32 holds every step exactly
    nearest = train(CompiledRowStore, dtype, "nearest")
    assert (nearest == 1.5).all()                                   # every update was lost
    numpy_sr, compiled_sr = train(NumpyRowStore, dtype, "stochastic"), train(CompiledRowStore, dtype, "stochastic")
    np.testing.assert_array_equal(numpy_sr, compiled_sr)            # deterministic: the same bits everywhere
    np.testing.assert_array_equal(rounded(numpy_sr, dtype), numpy_sr)     # on the format's grid
    steps = (1.5 - numpy_sr.astype(np.float64)) / gap               # whole gaps moved: Binomial(100, 1/8)
    np.testing.assert_array_equal(steps, np.round(steps))
    assert steps.std() > 2                                          # at random, not all alike
    assert abs(steps.mean() - 12.5) < 0.15                          # unbiased: the sd of the mean is 0.037
    assert not np.array_equal(train(CompiledRowStore, dtype, "stochastic", seed=6), compiled_sr)


def test_a_float16_rowwise_row_takes_44_bytes_plus_its_index():
    """dim 16, row-wise Adagrad: id 8 + values 2 * 16 + accumulator 4 (float32 rows: 76); the index
    comes on top, 10.7-21.3 bytes a row by its load."""
    store, _ = stores(RowWiseAdagrad(lr=0.1), keep_last_seen=False, count=False, kind=CompiledRowStore, dim=16,
                      row_format=("float16", "nearest"))
    assert store.bytes_per_row == 8 + 32 + 4
    for batch in np.array_split(np.arange(1, 200_001, dtype=np.uint64), 20):   # filled by pulls
        store.lookup_or_create(batch, 0, 1, 0.1)
    while store.index.draining:
        store.lookup(batch[:10])
    assert store.nbytes / store.num_rows <= 44 + 8 / 0.375 + 0.5
