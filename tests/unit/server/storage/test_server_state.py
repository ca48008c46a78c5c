"""Server state on its own (no sockets): membership, the step barrier, registration,
duplicate names and ids, limits, and failures that must leave state unchanged."""
import numpy as np
import pytest

import paramshard as ps
from paramshard.errors import ConfigError, LimitExceeded
from paramshard.limits import Limits
from paramshard.optim import SGD, Adam
from paramshard.server.core.barrier import Membership, StepBarrier
from paramshard.server.storage.dense_store import DenseStore
from paramshard.server.storage.id_index import IdIndex
from paramshard.server.storage.sparse_table import SparseTable
from paramshard.tables import Admission, Eviction


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


# -- membership -------------------------------------------------------------
def test_a_lost_trainer_that_comes_back_in_time_is_live_again():
    clock = Clock()
    m = Membership(2, grace=5.0, clock=clock)
    m.note_request(0), m.note_request(1)
    assert m.connection_lost(1)
    assert m.failed == {1} and not m.job_over()
    clock.now = 4.0
    m.note_request(1)
    assert m.failed == set() and m.live == {0, 1}
    clock.now = 100.0
    assert m.expire() == []


def test_a_lost_trainer_is_gone_after_the_grace_period_and_the_job_ends_when_no_one_is_left():
    clock = Clock()
    m = Membership(2, grace=5.0, clock=clock)
    m.note_request(0), m.note_request(1)
    m.connection_lost(1)
    clock.now = 4.9
    assert m.expire() == []
    clock.now = 5.0
    assert m.expire() == [1]
    assert not m.job_over()            # trainer 0 is still training
    m.leave(0)
    assert m.job_over()
    assert "lost" in m.summary() and "[1]" in m.summary()
    with pytest.raises(ConfigError, match="cannot rejoin"):
        m.leave(1)


def test_leave_is_checked():
    m = Membership(2, grace=5.0)
    with pytest.raises(ConfigError, match="not part of this job"):
        m.leave(7)
    m.leave(1)
    with pytest.raises(ConfigError, match="already left"):
        m.leave(1)


def test_trainers_that_never_connect_end_the_job_only_after_the_others_ended():
    clock = Clock()
    m = Membership(2, grace=5.0, clock=clock)
    m.note_request(0)
    m.leave(0)
    assert not m.job_over()            # trainer 1 may still be starting
    clock.now = 6.0
    assert m.never_arrived() == [1] and m.job_over()


def test_the_step_barrier_needs_every_trainer_that_has_not_left():
    m = Membership(3, grace=5.0)
    b = StepBarrier(m, "block w")
    b.check_arrival(0, 0, 0)
    b.arrive(0)
    with pytest.raises(ConfigError, match="twice"):
        b.check_arrival(0, 0, 0)
    with pytest.raises(ConfigError, match="at step 0"):
        b.check_arrival(1, 1, 0)
    with pytest.raises(ConfigError, match="not part of this job"):
        b.check_arrival(9, 0, 0)
    m.connection_lost(2)               # lost is still required: the step cannot finish without it
    b.arrive(1)
    assert not b.complete() and b.waiting_for() == [2]
    m.leave(2)
    assert b.complete()


# -- dense registration and pushes ------------------------------------------
def store(mode="sync", trainers=2):
    return DenseStore(mode, Membership(trainers, grace=5.0))


def test_registration_is_all_or_nothing():
    s = store()
    good, bad = np.zeros(4, np.float32), np.zeros(4, np.float64)
    with pytest.raises(ConfigError, match="float32"):
        s.register(0, ["a", "b"], [good, bad], SGD(lr=1.0), 0x1)
    assert s.blocks == {} and not s.registered
    assert s.register(0, ["a", "b"], [good, good], SGD(lr=1.0), 0x1)


def test_only_the_chief_registers_and_a_different_plan_never_replaces_the_first():
    s = store()
    with pytest.raises(ConfigError, match="only the chief"):
        s.register(1, ["a"], [np.zeros(4, np.float32)], SGD(lr=1.0), 0x1)
    s.register(0, ["a"], [np.zeros(4, np.float32)], SGD(lr=1.0), 0x1)
    assert not s.register(1, ["a"], [np.ones(4, np.float32)], SGD(lr=1.0), 0x1)   # identical: accepted, no change
    np.testing.assert_array_equal(s.blocks["a"].values, 0.0)
    with pytest.raises(ConfigError, match="different model"):
        s.register(0, ["fresh"], [np.zeros(4, np.float32)], SGD(lr=1.0), 0x2)
    assert s.plan_fingerprint == 0x1 and list(s.blocks) == ["a"]


def test_a_push_naming_a_block_twice_is_refused_and_changes_nothing():
    s = store(mode="async", trainers=1)
    s.register(0, ["w"], [np.zeros(2, np.float32)], SGD(lr=1.0), 0x1)
    g = np.ones(2, np.float32)
    with pytest.raises(ConfigError, match=r"\['w'\] more than once"):
        s.push(0, 0, ["w", "w"], [g, g])
    np.testing.assert_array_equal(s.blocks["w"].values, 0.0)


def test_sync_average_over_two_trainers():
    s = store()
    s.register(0, ["w"], [np.zeros(2, np.float32)], SGD(lr=1.0), 0x1)
    s.push(0, 0, ["w"], [np.full(2, 1.0, np.float32)])
    s.push(1, 0, ["w"], [np.full(2, 3.0, np.float32)])
    np.testing.assert_array_equal(s.blocks["w"].values, -2.0)
    with pytest.raises(ConfigError, match="not part of this job"):
        s.push(5, 1, ["w"], [np.ones(2, np.float32)])


# -- sparse tables ----------------------------------------------------------
def table(mode="async", trainers=1, limits=Limits(), **kw):
    return SparseTable("t", 4, seed=3, optimizer=kw.pop("optimizer", SGD(lr=1.0)),
                       admission=kw.pop("admission", Admission()), eviction=kw.pop("eviction", Eviction()),
                       init_scale=0.1, mode=mode, membership=Membership(trainers, grace=5.0), limits=limits,
                       **kw)


def test_distinct_push_with_repeated_ids_is_refused():
    t = table()
    ids = np.array([1, 2], np.uint64)
    before = t.pull(ids, trainer=0)
    with pytest.raises(ConfigError, match="repeat"):
        t.push(0, 0, np.array([1, 1], np.uint64), np.ones((2, 4), np.float32), distinct=True)
    np.testing.assert_array_equal(t.pull(ids), before)
    t.push(0, 0, np.array([1, 1], np.uint64), np.ones((2, 4), np.float32), distinct=False)   # merged
    np.testing.assert_allclose(t.pull(ids)[0], before[0] - 2.0)


def test_a_gradient_for_ids_never_pulled_is_an_error_but_unadmitted_ids_are_dropped_quietly():
    t = table()
    t.pull(np.array([1], np.uint64))
    with pytest.raises(ConfigError, match="never pulled"):
        t.push(0, 0, np.array([1, 99], np.uint64), np.ones((2, 4), np.float32))
    assert t.version == 0
    gated = table(admission=Admission(min_count=3))
    gated.pull(np.array([5], np.uint64))
    gated.push(0, 0, np.array([5], np.uint64), np.ones((1, 4), np.float32))   # seen, not admitted: dropped
    assert gated.num_rows == 0


def test_limits_are_errors_that_name_the_variable():
    with pytest.raises(LimitExceeded, match="PARAMSHARD_MAX_DIM"):
        SparseTable("t", 5000, seed=0, optimizer=SGD(), admission=Admission(), eviction=Eviction(),
                    init_scale=0.1, mode="async", membership=Membership(1, 5.0))
    t = table(limits=Limits(max_rows=10))
    t.pull(np.arange(8, dtype=np.uint64))
    with pytest.raises(LimitExceeded, match="PARAMSHARD_MAX_ROWS"):
        t.pull(np.arange(8, 16, dtype=np.uint64))
    assert t.num_rows == 8 and (t.index.lookup(np.arange(8, 16, dtype=np.uint64)) == -1).all()


def _fail_numpy_initial_rows(monkeypatch, table):
    from paramshard.server.storage import row_store
    monkeypatch.setattr(row_store, "initial_rows", out_of_memory)


def _fail_compiled_index_growth(monkeypatch, table):
    monkeypatch.setattr(table.store.index, "make_room", out_of_memory)


def out_of_memory(*args, **kwargs):
    raise MemoryError("simulated")


@pytest.mark.parametrize("store, fail", [("numpy", _fail_numpy_initial_rows),
                                         ("compiled", _fail_compiled_index_growth)])
def test_a_failed_row_creation_leaves_the_index_unchanged(monkeypatch, store, fail):
    from paramshard.server.storage.row_stores import store_named
    t = table(store=store_named(store))
    t.pull(np.arange(3, dtype=np.uint64))
    fail(monkeypatch, t)
    new = np.arange(100, 5100, dtype=np.uint64)       # more than the index holds without growing
    with pytest.raises(MemoryError):
        t.pull(new)
    assert t.num_rows == 3 and (t.store.lookup(np.arange(3, dtype=np.uint64)) == np.arange(3)).all()
    assert (t.store.lookup(new) == -1).all()
    monkeypatch.undo()
    rows = t.pull(new)
    assert t.num_rows == 5003 and rows.shape == (5000, 4)


def test_a_failed_index_insert_leaves_the_index_unchanged(monkeypatch):
    ix = IdIndex(16)
    ix.insert(np.arange(5, dtype=np.uint64))
    real_place = IdIndex._place
    calls = {"n": 0}

    def failing_place(store, buckets, rows):
        calls["n"] += 1
        real_place(store, buckets, rows[: len(rows) // 2])   # half written, then out of memory
        raise MemoryError("simulated")
    monkeypatch.setattr(IdIndex, "_place", staticmethod(failing_place))
    with pytest.raises(MemoryError):
        ix.insert(np.arange(5, 8, dtype=np.uint64))
    monkeypatch.undo()
    assert calls["n"] == 1 and ix.size == 5
    np.testing.assert_array_equal(ix.lookup(np.arange(8, dtype=np.uint64)), [0, 1, 2, 3, 4, -1, -1, -1])
    np.testing.assert_array_equal(ix.insert(np.arange(5, 8, dtype=np.uint64)), [5, 6, 7])


# -- arguments are checked where they are given -------------------------------
@pytest.mark.parametrize("kwargs,match", [
    ({"seed": -1}, "seed"), ({"seed": 2**64}, "seed"), ({"seed": 1.5}, "seed"),
    ({"init_scale": float("nan")}, "init_scale"), ({"init_scale": float("inf")}, "init_scale"),
    ({"init_scale": -0.1}, "init_scale"),
])
def test_sparse_embedding_rejects_bad_settings_at_construction(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        ps.SparseEmbedding("t", 4, **kwargs)


@pytest.mark.parametrize("make", [lambda: SGD(lr=float("nan")), lambda: SGD(lr=float("inf")),
                                  lambda: Adam(eps=float("nan")), lambda: SGD(lr=True)])
def test_optimizers_reject_non_finite_settings(make):
    with pytest.raises(ConfigError):
        make()
