"""SparseTable and IdIndex on their own: admission, eviction, merging, determinism."""
import numpy as np
import pytest

from paramshard.errors import ConfigError
from paramshard.optim import SGD, Adagrad
from paramshard.placement.rows import merge_duplicates
from paramshard.limits import Limits
from paramshard.server.core.barrier import Membership
from paramshard.server.storage.id_index import IdIndex
from paramshard.server.storage.sparse_table import SparseTable
from paramshard.placement.sparse_hash import admitted_by_probability, initial_rows, server_of
from paramshard.tables import Admission, Eviction


def table(mode="async", trainers=1, admission=Admission(), eviction=Eviction(), optimizer=SGD(lr=1.0), dim=4,
          limits=Limits()):
    return SparseTable("t", dim, seed=3, optimizer=optimizer, admission=admission, eviction=eviction,
                       init_scale=0.1, mode=mode, membership=Membership(trainers, grace=10.0), limits=limits)


def test_id_index_matches_a_dict_through_growth():
    rng = np.random.default_rng(0)
    ix, ref = IdIndex(4), {}
    for _ in range(20):
        batch = np.unique(rng.integers(0, 2**64 - 2, 3000, dtype=np.uint64))
        new = np.array([k for k in batch if int(k) not in ref], np.uint64)
        rows = ix.insert(new)
        np.testing.assert_array_equal(rows, np.arange(len(ref), len(ref) + len(new)))
        ref.update(zip(map(int, new), rows))
    probe = np.concatenate([np.array(list(ref), np.uint64)[:5000],
                            rng.integers(0, 2**64 - 2, 2000, dtype=np.uint64)])
    expected = [ref.get(int(k), -1) for k in probe]
    np.testing.assert_array_equal(ix.lookup(probe), expected)
    assert ix.size == len(ref)


def test_a_reserved_index_maps_exactly_what_a_growing_one_does():
    rng = np.random.default_rng(1)
    batches = [np.unique(rng.integers(0, 2**64 - 2, 4000, dtype=np.uint64)) for _ in range(6)]
    grown, reserved = IdIndex(4), IdIndex(4)
    reserved.insert(batches[0][:10])
    grown.insert(batches[0][:10])
    reserved.reserve(30_000)             # after some ids: they are placed again
    buckets = len(reserved.buckets)
    for batch in batches[1:]:
        new = batch[grown.lookup(batch) < 0]
        np.testing.assert_array_equal(grown.insert(new), reserved.insert(new))
    assert len(reserved.buckets) == buckets     # never rehashed while filling
    probe = np.concatenate([np.concatenate(batches), rng.integers(0, 2**64 - 2, 500, dtype=np.uint64)])
    np.testing.assert_array_equal(grown.lookup(probe), reserved.lookup(probe))


def test_every_uint64_can_be_stored():
    ix = IdIndex()
    extremes = np.array([0, 1, 2**63, 2**64 - 1], np.uint64)
    ix.insert(extremes)
    np.testing.assert_array_equal(ix.lookup(extremes[::-1]), [3, 2, 1, 0])
    np.testing.assert_array_equal(ix.ids_by_row(), extremes)


def test_rows_are_created_on_first_pull_with_the_deterministic_initializer():
    t = table()
    ids = np.array([10, 2**63 + 5, 10, 7], np.uint64)
    rows = t.pull(ids)
    np.testing.assert_array_equal(rows, initial_rows(3, ids, 4, 0.1))
    assert t.num_rows == 3
    # arrival order does not matter
    t2 = table()
    t2.pull(ids[::-1])
    np.testing.assert_array_equal(t2.pull(ids), rows)


def test_initializer_and_ownership_are_pure_functions():
    ids = np.arange(1000, dtype=np.uint64)
    a = initial_rows(5, ids, 8, 0.5)
    assert np.all(np.abs(a) <= 0.5) and a.std() > 0.2
    np.testing.assert_array_equal(a[10:20], initial_rows(5, ids[10:20], 8, 0.5))
    assert not np.array_equal(a, initial_rows(6, ids, 8, 0.5))
    owners = server_of(ids, 4)
    assert set(owners) == {0, 1, 2, 3} and np.bincount(owners).min() > 200


def test_merge_duplicates_sums_rows_of_equal_ids():
    ids = np.array([5, 3, 5, 5, 9], np.uint64)
    grads = np.arange(10, dtype=np.float32).reshape(5, 2)
    m_ids, m_grads = merge_duplicates(ids, grads)
    np.testing.assert_array_equal(m_ids, [3, 5, 9])
    np.testing.assert_array_equal(m_grads, [[2, 3], [0 + 4 + 6, 1 + 5 + 7], [8, 9]])


def test_async_push_applies_per_row_sgd():
    t = table()
    ids = np.array([1, 2], np.uint64)
    before = t.pull(ids)
    t.push(0, 0, np.array([2, 1, 2], np.uint64), np.ones((3, 4), np.float32))
    np.testing.assert_allclose(t.pull(ids), before - np.array([[1.0], [2.0]]))


def test_sync_push_waits_for_every_trainer_and_averages():
    t = table(mode="sync", trainers=2)
    ids = np.array([1], np.uint64)
    before = t.pull(ids)
    t.push(0, 0, ids, np.full((1, 4), 2.0, np.float32))
    np.testing.assert_array_equal(t.pull(ids), before)           # not applied yet
    assert t.waiting_for() == [1]
    t.push(1, 0, np.empty(0, np.uint64), np.empty((0, 4), np.float32))
    np.testing.assert_allclose(t.pull(ids), before - 1.0)         # (2 + 0) / 2 trainers
    assert t.version == 1
    with pytest.raises(ConfigError, match="pushed step 0 .* at step 1"):
        t.push(0, 0, ids, np.ones((1, 4), np.float32))


def test_wrong_gradient_shape_is_refused():
    t = table()
    with pytest.raises(ConfigError, match=r"expected \[2, 4\]"):
        t.push(0, 0, np.array([1, 2], np.uint64), np.ones((2, 3), np.float32))


def test_min_count_admission():
    t = table(admission=Admission(min_count=3))
    ids = np.array([42], np.uint64)
    for seen in (1, 2):
        np.testing.assert_array_equal(t.pull(ids), 0.0)           # not admitted yet: zeros
        t.push(0, 0, ids, np.ones((1, 4), np.float32))           # its gradient is dropped
        assert t.num_rows == 0
    np.testing.assert_array_equal(t.pull(ids), initial_rows(3, ids, 4, 0.1))   # third sighting
    assert t.num_rows == 1


def test_probability_admission_is_deterministic_and_near_the_rate():
    t = table(admission=Admission(probability=0.25))
    ids = np.arange(20000, dtype=np.uint64)
    rows = t.pull(ids)
    admitted = np.any(rows != 0, axis=1)
    assert 0.22 < admitted.mean() < 0.28
    np.testing.assert_array_equal(admitted, admitted_by_probability(3, ids, 0.25))


def test_rows_unseen_for_n_steps_are_evicted_and_come_back_fresh():
    t = table(eviction=Eviction(unseen_steps=4))
    hot, cold = np.array([1], np.uint64), np.array([2], np.uint64)
    t.pull(np.array([1, 2], np.uint64))
    t.push(0, 0, cold, np.ones((1, 4), np.float32))   # cold moves away from its initial row
    for _ in range(10):
        t.pull(hot)
        t.push(0, 0, hot, np.ones((1, 4), np.float32))
    assert t.num_rows == 1 and t.evicted == 1
    np.testing.assert_array_equal(t.pull(cold), initial_rows(3, cold, 4, 0.1))
    np.testing.assert_allclose(t.pull(hot), initial_rows(3, hot, 4, 0.1) - 10.0)


def test_export_and_load_round_trip():
    t = table(optimizer=Adagrad(lr=0.1))
    ids = np.array([5, 1, 9], np.uint64)
    t.pull(ids)
    t.push(0, 0, ids, np.ones((3, 4), np.float32))
    out_ids, values = t.export()
    t2 = table(optimizer=Adagrad(lr=0.1))
    t2.load(out_ids, values)
    np.testing.assert_array_equal(t2.pull(ids), t.pull(ids))


def test_memory_is_accounted():
    t = table(optimizer=Adagrad(lr=0.1), dim=16)
    t.pull(np.arange(100000, dtype=np.uint64))
    raw = 100000 * 16 * 4 * 2
    assert raw < t.nbytes < 2 * raw


@pytest.mark.parametrize("store", ["numpy", "compiled"])
def test_a_drop_in_slices_between_sync_pushes_keeps_every_other_row_exact(store):
    """Rows of partitions handed away go a slice at a time (drop_later / drop_some), while a sync
    step's push waits for the other trainer holding row handles that the drop moves: the step
    still updates the right rows, bit for bit as a table that never dropped anything."""
    from paramshard.server.storage.row_stores import store_named
    tables = [SparseTable("t", 4, seed=3, optimizer=Adagrad(lr=0.1), admission=Admission(), eviction=Eviction(),
                          init_scale=0.1, mode="sync", membership=Membership(2, grace=10.0),
                          store=store_named(store)) for _ in range(2)]
    dropping, oracle = tables
    rng = np.random.default_rng(5)
    ids = np.unique(rng.integers(0, 1 << 40, 3000).astype(np.uint64))
    doomed = ids[ids % 3 == 0]
    kept = ids[ids % 3 != 0]
    for t in tables:
        t.pull(ids, 0)
    dropping.drop_later(lambda some: some % 3 == 0)
    assert dropping.drop_some(rows=100) >= 0 and dropping.dropping
    for step in range(20):
        pushed = [np.unique(rng.choice(kept, 200)) for _ in range(2)]
        grads = [rng.standard_normal((len(p), 4)).astype(np.float32) for p in pushed]
        for t in tables:
            t.pull(pushed[0], 0)
            t.push(0, step, pushed[0], grads[0], distinct=True)      # waits for trainer 1: handles held
        for _ in range(3):
            dropping.drop_some(rows=100)                              # rows move under the pending push
        for t in tables:
            t.pull(pushed[1], 1)
            t.push(1, step, pushed[1], grads[1], distinct=True)
    while dropping.dropping:
        dropping.drop_some(rows=100)
    assert (dropping.store.lookup(doomed) == -1).all() and dropping.num_rows == len(kept)
    got, want = dropping.store.lookup(kept), oracle.store.lookup(kept)
    np.testing.assert_array_equal(dropping.store.gather(got), oracle.store.gather(want))
    for name, a in oracle.store.state_of(want).items():
        np.testing.assert_array_equal(dropping.store.state_of(got)[name], a, err_msg=name)


def test_a_drop_in_a_tiered_table_is_one_compaction_with_the_pushes_pending(tmp_path):
    """A table with a memory budget (disk tier) moves too: its store drops by compacting every row
    (TieredRowStore.drop), so drop_some does the whole drop at once, not a compaction per slice;
    a sync push pending meanwhile still updates the right rows (oracle: a table that never dropped)."""
    from paramshard.server.storage.row_stores import store_named
    made = [SparseTable("t", 4, seed=3, optimizer=Adagrad(lr=0.1), admission=Admission(), eviction=Eviction(),
                        init_scale=0.1, mode="sync", membership=Membership(2, grace=10.0),
                        store=store_named("compiled"), **budget)
            for budget in ({"memory_budget": 1 << 20, "tier_dir": tmp_path / "t"}, {})]
    dropping, oracle = made
    assert getattr(dropping.store, "drop_compacts", False) and not getattr(oracle.store, "drop_compacts", False)
    rng = np.random.default_rng(5)
    ids = np.unique(rng.integers(0, 1 << 40, 3000).astype(np.uint64))
    kept = ids[ids % 3 != 0]
    for t in made:
        t.pull(ids, 0)
    pushed = np.unique(rng.choice(kept, 200))
    grads = rng.standard_normal((len(pushed), 4)).astype(np.float32)
    for t in made:
        t.pull(pushed, 0)
        t.push(0, 0, pushed, grads, distinct=True)          # waits for trainer 1: row handles held
    dropping.drop_later(lambda some: some % 3 == 0)
    assert dropping.drop_some(rows=100) == len(ids) - len(kept) and not dropping.dropping     # all at once
    for t in made:
        t.pull(pushed, 1)
        t.push(1, 0, pushed, grads, distinct=True)
    assert dropping.num_rows == len(kept) and (dropping.store.lookup(ids[ids % 3 == 0]) == -1).all()
    got, want = dropping.store.lookup(kept), oracle.store.lookup(kept)
    np.testing.assert_array_equal(dropping.store.gather(got), oracle.store.gather(want))
