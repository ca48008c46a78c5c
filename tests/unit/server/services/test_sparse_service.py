"""server/services/sparse_service.py without sockets: registration rules, a pull that waits for the
step (sync) or for the chief's registration, pushes, export and import."""
import numpy as np
import pytest

import paramshard as ps
from paramshard.errors import ConfigError, LimitExceeded
from paramshard.limits import Limits
from paramshard.server.core.barrier import Membership
from paramshard.server.core.replies import Deferred
from paramshard.server.services.sparse_service import SparseService
from paramshard.placement.sparse_hash import initial_rows
from paramshard.tables import Admission, Eviction, policy_to_wire


def register(service, trainer=0, name="t", dim=2, lr=1.0, **extra):
    header = {"table": name, "trainer": trainer, "dim": dim, "seed": 4, "optimizer": ps.optim.SGD(lr=lr).to_wire(),
              "policy": policy_to_wire(Admission(), Eviction(), 0.1), **extra}
    return service.handle_register_sparse(header, [])


def pull(service, ids, trainer=0, version=0, name="t"):
    return service.handle_pull_sparse({"table": name, "trainer": trainer, "min_version": version},
                                      [np.asarray(ids, np.uint64)])


def push(service, ids, grads, trainer=0, step=0):
    return service.handle_push_sparse({"table": "t", "trainer": trainer, "step": step, "distinct": True},
                                      [np.asarray(ids, np.uint64), np.asarray(grads, np.float32)])


def test_only_the_chief_creates_a_table_and_repeats_must_match():
    service = SparseService("sync", Membership(2, grace=5.0))
    with pytest.raises(ConfigError, match="only the chief"):
        register(service, trainer=1)
    assert register(service).fields == {"rows": 0}
    assert register(service, trainer=1).fields == {"rows": 0}          # the identical registration
    with pytest.raises(ConfigError, match="other settings"):
        register(service, lr=0.5)
    with pytest.raises(LimitExceeded, match="PARAMSHARD_MAX_ROWS"):
        SparseService("sync", Membership(1, 5.0), Limits(max_rows=10)).handle_register_sparse(
            {"table": "u", "trainer": 0, "dim": 2, "seed": 0, "optimizer": ps.optim.SGD().to_wire(),
             "policy": policy_to_wire(Admission(), Eviction(), 0.1), "reserve": 11}, [])


def test_a_pull_waits_for_the_registration_and_for_the_sync_step():
    service = SparseService("sync", Membership(2, grace=5.0))
    early = pull(service, [1])
    assert isinstance(early, Deferred) and not early.ready() and early.waits_on() == [0]
    assert "has not registered sparse table 't'" in early.describe()
    register(service)
    assert early.ready()
    np.testing.assert_array_equal(early.make_reply().arrays[0], initial_rows(4, np.array([1], np.uint64), 2, 0.1))
    pull(service, [1], trainer=1).make_reply()
    push(service, [1], [[1.0, 2.0]], trainer=0)
    next_step = pull(service, [1], trainer=0, version=1)
    assert not next_step.ready() and next_step.waits_on() == [1]
    push(service, [1], [[3.0, 4.0]], trainer=1)
    assert next_step.ready()
    expected = initial_rows(4, np.array([1], np.uint64), 2, 0.1) - np.array([[2.0, 3.0]], np.float32)   # the mean
    np.testing.assert_array_equal(next_step.make_reply().arrays[0], expected)


def test_a_leave_completes_a_step_that_only_waited_for_that_trainer():
    membership = Membership(2, grace=5.0)
    service = SparseService("sync", membership)
    register(service)
    pull(service, [7]).make_reply()
    push(service, [7], [[1.0, 1.0]])
    assert service.tables["t"].version == 0
    membership.leave(1)
    service.on_leave(1)
    assert service.tables["t"].version == 1


def test_export_then_import_into_a_fresh_service_gives_the_same_rows():
    service = SparseService("async", Membership(1, grace=5.0))
    register(service)
    pull(service, [3, 5, 9]).make_reply()
    push(service, [3, 9], [[1.0, 0.0], [0.0, 1.0]])
    exported = service.handle_export_sparse({"table": "t"}, [])
    assert exported.fields["dim"] == 2 and exported.fields["seed"] == 4
    fresh = SparseService("async", Membership(1, grace=5.0))
    register(fresh)
    assert fresh.handle_import_sparse({"table": "t"}, list(exported.arrays)).fields == {"rows": 3}
    np.testing.assert_array_equal(pull(fresh, [3, 5, 9]).make_reply().arrays[0],
                                  pull(service, [3, 5, 9]).make_reply().arrays[0])
    with pytest.raises(ConfigError, match="unknown sparse table 'nope'"):
        fresh.handle_export_sparse({"table": "nope"}, [])
    stats = fresh.stats()
    assert stats["sparse_rows"] == 3 and stats["tables"]["t"]["rows"] == 3


def test_a_table_of_half_rows_is_registered_once_with_its_format():
    """dtype and rounding travel with the registration (absent: float32); a repeat must ask for the
    same; rows come out as float32 holding values of the format, the first pull's included."""
    service = SparseService("sync", Membership(2, grace=5.0))
    register(service, dtype="float16", rounding="stochastic")
    table = service.tables["t"]
    assert (table.dtype, table.rounding, table.store.value_dtype) == ("float16", "stochastic", "float16")
    assert register(service, trainer=1, dtype="float16", rounding="stochastic").fields == {"rows": 0}
    with pytest.raises(ConfigError, match="its rows are float16 \\(stochastic rounding\\), this registration asks "
                                          "for float32 \\(nearest\\)"):
        register(service, trainer=1)
    with pytest.raises(ConfigError, match="rows are stored as one of float32, float16, bfloat16"):
        register(service, name="u", dtype="float64")
    ids = np.array([1, 2, 3], np.uint64)
    rows = pull(service, ids).make_reply().arrays[0]
    assert rows.dtype == np.float32
    np.testing.assert_array_equal(rows, initial_rows(4, ids, 2, 0.1).astype(np.float16).astype(np.float32))
    evaluation = service.handle_pull_sparse({"table": "t", "trainer": 0, "min_version": 0, "create": False},
                                            [np.array([3, 9], np.uint64)]).make_reply().arrays[0]
    unseen = initial_rows(4, np.array([9], np.uint64), 2, 0.1).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(evaluation, np.stack([rows[2], unseen[0]]))       # unseen: as its first pull
    pull(service, ids, trainer=1).make_reply()
    push(service, ids, np.full((3, 2), 1e-3, np.float32), trainer=0)
    push(service, ids, np.full((3, 2), 3e-3, np.float32), trainer=1)
    after = pull(service, ids, version=1).make_reply().arrays[0]
    np.testing.assert_array_equal(after.astype(np.float16).astype(np.float32), after)      # representable
    assert not np.array_equal(after, rows)
    exported = service.handle_export_sparse({"table": "t"}, [])
    assert exported.arrays[1].dtype == np.float32
    np.testing.assert_array_equal(exported.arrays[1][np.argsort(exported.arrays[0])], after)


def test_a_sync_push_one_step_ahead_waits_for_the_step_in_progress_then_counts():
    """Issue 29 (found by the combination matrix): trainer 1 finished step 0 on the servers holding
    dense blocks and pushes step 1 here before trainer 0's push of step 0 reached this server
    (nothing orders two trainers' messages to one server). Before, it was refused ("every trainer
    must push every step once") and the job failed; now it waits, and the rows equal the in-order run."""
    def run(early: bool):
        service = SparseService("sync", Membership(2, grace=5.0))
        register(service)
        late_seen = []
        service.on_late_push = lambda table, ids: late_seen.append((table, ids.tolist()))
        pull(service, [1, 2]).make_reply()
        push(service, [1], [[1.0, 2.0]], trainer=1, step=0)
        if early:
            ahead = push(service, [2], [[5.0, 5.0]], trainer=1, step=1)
            assert isinstance(ahead, Deferred) and not ahead.ready() and ahead.waits_on() == [0]
            assert "waits for step 0: trainers [0] have not pushed it here" in ahead.describe()
            push(service, [1, 2], [[3.0, 4.0], [1.0, 1.0]], trainer=0, step=0)
            assert ahead.ready()
            ahead.make_reply()
            assert late_seen == [("t", [2])]
        else:
            push(service, [1, 2], [[3.0, 4.0], [1.0, 1.0]], trainer=0, step=0)
            push(service, [2], [[5.0, 5.0]], trainer=1, step=1)
        push(service, [1], [[1.0, 1.0]], trainer=0, step=1)
        assert service.tables["t"].version == 2
        return pull(service, [1, 2], version=2).make_reply().arrays[0]

    np.testing.assert_array_equal(run(early=True), run(early=False))


def test_a_sync_push_two_steps_ahead_is_still_refused():
    service = SparseService("sync", Membership(2, grace=5.0))
    register(service)
    with pytest.raises(ConfigError, match="every trainer must push every step once"):
        push(service, [1], [[1.0, 1.0]], trainer=1, step=2)
