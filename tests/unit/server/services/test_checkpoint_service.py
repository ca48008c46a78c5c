"""server/services/checkpoint_service.py on a ServerContext, no sockets: sparse pages out and back in
(bit-identical, admission counters included), what a restore refuses, and the async cut."""
import numpy as np
import pytest

import paramshard as ps
from paramshard.errors import ConfigError
from paramshard.mode import Mode
from paramshard.server.services.checkpoint_service import CheckpointService
from paramshard.server.storage.dense_store import DenseStore
from paramshard.server.core.hooks import Incoming, Verdict
from paramshard.server.core.replies import Deferred
from paramshard.server.services.sparse_service import SparseService
from paramshard.tables import Admission, Eviction, policy_to_wire

from tests.unit.server_fakes import context


def service_with_table(mode=Mode.ASYNC, admission=Admission(min_count=2), optimizer=ps.optim.Adam(lr=0.01)):
    ctx = context(mode, trainers=1)
    sparse = SparseService(mode, ctx.membership)
    sparse.handle_register_sparse({"table": "t", "trainer": 0, "dim": 3, "seed": 9, "optimizer": optimizer.to_wire(),
                                   "policy": policy_to_wire(admission, Eviction(unseen_steps=50), 0.1)}, [])
    return ctx, sparse, CheckpointService(DenseStore(mode, ctx.membership), sparse, ctx)


def train(sparse, steps=6):
    rng = np.random.default_rng(3)
    for step in range(steps):
        ids = np.unique(rng.integers(0, 40, 15).astype(np.uint64))
        sparse.handle_pull_sparse({"table": "t", "trainer": 0, "min_version": 0}, [ids]).make_reply()
        sparse.handle_push_sparse({"table": "t", "trainer": 0, "step": step, "distinct": True},
                                  [ids, rng.standard_normal((len(ids), 3)).astype(np.float32)])


def snapshot(checkpoints, page=7):
    pages, start = [], 0
    while True:
        reply = checkpoints.handle_snapshot_sparse({"table": "t", "start": start, "count": page}, [])
        pages.append(reply)
        start += page
        if start >= reply.fields["rows"]:
            return pages


def test_pages_restore_into_an_equal_table():
    _, sparse, checkpoints = service_with_table()
    train(sparse)
    pages = snapshot(checkpoints)
    assert pages[0].fields["parts"] == ["ids", "values", "slot0", "slot1", "steps", "last_seen", "counted_ids", "counts"]
    assert "counted_ids" not in pages[1].fields["parts"]            # counters travel on the first page only
    _, copy_sparse, copy = service_with_table()
    total = pages[0].fields["rows"]
    for i, page in enumerate(pages):
        header = {"table": "t", "trainer": 0, "parts": page.fields["parts"], "version": page.fields["version"],
                  "evicted": page.fields["evicted"], **({"reserve": total} if i == 0 else {})}
        copy.handle_restore_sparse(header, list(page.arrays))
    again = snapshot(copy)
    for before, after in zip(pages, again):
        assert before.fields == after.fields
        for a, b in zip(before.arrays, after.arrays):
            np.testing.assert_array_equal(a, b)
    original, restored = sparse.tables["t"], copy_sparse.tables["t"]
    assert restored.version == original.version == 6 and restored.num_rows == original.num_rows


def test_a_restore_is_checked_before_it_changes_anything():
    _, sparse, checkpoints = service_with_table(admission=Admission())
    table = sparse.tables["t"]
    ids, values = np.array([1, 2], np.uint64), np.zeros((2, 3), np.float32)
    slots = [np.zeros((2, 3), np.float32)] * 2
    header = {"table": "t", "trainer": 0, "parts": ["ids", "values", "slot0", "slot1"], "version": 0, "evicted": 0}
    with pytest.raises(ConfigError, match="only the chief"):
        checkpoints.handle_restore_sparse(dict(header, trainer=1), [ids, values, *slots])
    with pytest.raises(ConfigError, match="some ids appear twice"):
        checkpoints.handle_restore_sparse(header, [np.array([1, 1], np.uint64), values, *slots])
    with pytest.raises(ConfigError, match="slot1 must be float32"):
        checkpoints.handle_restore_sparse(header, [ids, values, slots[0], np.zeros((2, 2), np.float32)])
    with pytest.raises(ConfigError, match="reserve must be >= 0"):
        checkpoints.handle_restore_sparse(dict(header, reserve=-1), [ids, values, *slots])
    assert table.num_rows == 0
    checkpoints.handle_restore_sparse(header, [ids, values, *slots])
    with pytest.raises(ConfigError, match="already has rows"):
        checkpoints.handle_restore_sparse(header, [ids, values, *slots])
    assert table.num_rows == 2


def test_a_sync_snapshot_waits_for_the_step_it_asks_for():
    _, sparse, checkpoints = service_with_table(Mode.SYNC)
    waits = checkpoints.handle_snapshot_sparse({"table": "t", "start": 0, "count": 10, "min_version": 1}, [])
    assert isinstance(waits, Deferred) and not waits.ready() and waits.waits_on() == [0]
    train(sparse, steps=1)
    assert waits.ready() and waits.make_reply().fields["version"] == 1


def test_the_async_cut_holds_pushes_and_releases_them_through_the_context():
    ctx, _, checkpoints = service_with_table()
    hook = checkpoints.hooks()[0]
    push = Incoming("push_sparse", {"step": 4, "table": "t"}, 0, held="frames of step 4")
    hook.applied(Incoming("push_sparse", {"step": 3, "table": "t"}, 0))
    assert checkpoints.handle_pause_pushes({}, []).fields == {"applied": [["sparse:t", 0, 3]], "since": 0,
                                                              "routings": []}
    assert hook.admit(push) is Verdict.HOLD
    with pytest.raises(ConfigError, match="list of \\[trainer, step\\] pairs"):
        checkpoints.handle_cut_pushes({"cut": [[0]]}, [])
    waits = checkpoints.handle_cut_pushes({"cut": [[0, 3]]}, [])
    assert waits.ready() and ctx.resubmitted == []                     # step 4 is past the cut: still held
    assert checkpoints.handle_resume_pushes({}, []).fields == {"released": 1}
    assert ctx.resubmitted == ["frames of step 4"]
    with pytest.raises(ConfigError, match="cut_pushes before pause_pushes"):
        checkpoints.handle_cut_pushes({"cut": [[0, 3]]}, [])


def test_row_wise_adagrad_pages_carry_one_accumulator_per_row_and_restore_bit_identical():
    optimizer = ps.optim.RowWiseAdagrad(lr=0.1, initial_accumulator_value=0.01)
    _, sparse, checkpoints = service_with_table(optimizer=optimizer)
    train(sparse)
    pages = snapshot(checkpoints)
    rows = pages[0].fields["rows"]
    assert pages[0].fields["parts"] == ["ids", "values", "slot0", "last_seen", "counted_ids", "counts"]    # no steps
    got = dict(zip(pages[0].fields["parts"], pages[0].arrays))
    assert got["slot0"].shape == (min(rows, 7), 1) and (got["slot0"] > 0.01).all()     # every row was pushed
    _, copy_sparse, copy = service_with_table(optimizer=optimizer)
    for i, page in enumerate(pages):
        header = {"table": "t", "trainer": 0, "parts": page.fields["parts"], "version": page.fields["version"],
                  "evicted": page.fields["evicted"], **({"reserve": rows} if i == 0 else {})}
        copy.handle_restore_sparse(header, list(page.arrays))
    for before, after in zip(pages, snapshot(copy)):
        assert before.fields == after.fields
        for a, b in zip(before.arrays, after.arrays):
            np.testing.assert_array_equal(a, b)
    # The restored table trains on exactly as the original does.
    train(sparse, steps=3)
    train(copy_sparse, steps=3)
    for before, after in zip(snapshot(checkpoints), snapshot(copy)):
        for a, b in zip(before.arrays, after.arrays):
            np.testing.assert_array_equal(a, b)


def test_a_row_wise_restore_wants_one_accumulator_per_row():
    _, sparse, checkpoints = service_with_table(admission=Admission(), optimizer=ps.optim.RowWiseAdagrad())
    ids, values = np.array([1, 2], np.uint64), np.zeros((2, 3), np.float32)
    header = {"table": "t", "trainer": 0, "parts": ["ids", "values", "slot0"], "version": 0, "evicted": 0}
    with pytest.raises(ConfigError, match=r"slot0 must be float32\[2, 1\]"):
        checkpoints.handle_restore_sparse(header, [ids, values, np.zeros((2, 3), np.float32)])
    assert sparse.tables["t"].num_rows == 0
    checkpoints.handle_restore_sparse(header, [ids, values, np.full((2, 1), 0.5, np.float32)])
    page = checkpoints.handle_snapshot_sparse({"table": "t", "start": 0, "count": 10}, [])
    assert dict(zip(page.fields["parts"], page.arrays))["slot0"].tolist() == [[0.5], [0.5]]


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_half_row_pages_carry_float32_and_restore_bit_identical(rounding):
    """A float16 table's pages hold float32 values, each exactly a float16; restored into a new
    float16 table they give the same pages, and both tables train on alike, bit for bit (stochastic
    rounding's bits depend on the table version, which the restore carries)."""
    def half_service():
        ctx = context(Mode.ASYNC, trainers=1)
        sparse = SparseService(Mode.ASYNC, ctx.membership)
        sparse.handle_register_sparse({"table": "t", "trainer": 0, "dim": 3, "seed": 9,
                                       "optimizer": ps.optim.RowWiseAdagrad(lr=0.1).to_wire(),
                                       "policy": policy_to_wire(Admission(), Eviction(), 0.1),
                                       "dtype": "float16", "rounding": rounding}, [])
        return sparse, CheckpointService(DenseStore(Mode.ASYNC, ctx.membership), sparse, ctx)

    sparse, checkpoints = half_service()
    train(sparse)
    pages = snapshot(checkpoints)
    values = dict(zip(pages[0].fields["parts"], pages[0].arrays))["values"]
    assert values.dtype == np.float32
    np.testing.assert_array_equal(values.astype(np.float16).astype(np.float32), values)
    copy_sparse, copy = half_service()
    rows = pages[0].fields["rows"]
    for i, page in enumerate(pages):
        header = {"table": "t", "trainer": 0, "parts": page.fields["parts"], "version": page.fields["version"],
                  "evicted": page.fields["evicted"], **({"reserve": rows} if i == 0 else {})}
        copy.handle_restore_sparse(header, list(page.arrays))
    for before, after in zip(pages, snapshot(copy)):
        assert before.fields == after.fields
        for a, b in zip(before.arrays, after.arrays):
            assert a.tobytes() == b.tobytes()
    train(sparse, steps=4)
    train(copy_sparse, steps=4)
    for before, after in zip(snapshot(checkpoints), snapshot(copy)):
        for a, b in zip(before.arrays, after.arrays):
            assert a.tobytes() == b.tobytes()


def test_admission_counters_come_whole_or_are_refused_naming_the_missing_part():
    """restore_sparse with ``counted_ids`` but no ``counts`` was a KeyError (an ``internal``
    reply): now a refusal naming the part, before any row is stored."""
    _, sparse, checkpoints = service_with_table(admission=Admission(min_count=2))
    ids, values = np.array([1, 2], np.uint64), np.zeros((2, 3), np.float32)
    slots = [np.zeros((2, 3), np.float32)] * 2
    header = {"table": "t", "trainer": 0, "version": 0, "evicted": 0}
    rows = ["ids", "values", "slot0", "slot1"]
    counted, counts = np.array([7, 8], np.uint64), np.array([1, 1], np.int64)
    for parts, extra, why in [
            (["counted_ids"], [counted], "part 'counted_ids' comes without 'counts'"),
            (["counts"], [counts], "part 'counts' comes without 'counted_ids'"),
            (["counted_ids", "counts"], [counted, counts[:1]], r"counts must be integers, one per counted id \(2\)"),
            (["counted_ids", "counts"], [counted, counts.astype(np.float32)], "counts must be integers"),
            (["counted_ids", "counts"], [counted, -counts], "counts must be >= 0"),
            (["counted_ids", "counts"], [counted.astype(np.int64), counts], r"counted_ids must be uint64\[n\]")]:
        with pytest.raises(ConfigError, match=why):
            checkpoints.handle_restore_sparse(dict(header, parts=rows + parts), [ids, values, *slots, *extra])
    assert sparse.tables["t"].num_rows == 0
    checkpoints.handle_restore_sparse(dict(header, parts=rows + ["counted_ids", "counts"]),
                                      [ids, values, *slots, counted, counts])
    assert sparse.tables["t"].num_rows == 2


def test_checkpoints_and_moves_take_turns_on_server_0():
    _, sparse, checkpoints = service_with_table(Mode.SYNC)
    begin, end = checkpoints.handle_exclude_begin, checkpoints.handle_exclude_end
    begin({"who": "checkpoint", "trainer": 0}, [])                      # free: granted at once
    move = begin({"who": "move"}, [])
    assert isinstance(move, Deferred) and not move.ready() and "trainer 0's checkpoint" in move.describe()
    end({"who": "checkpoint", "trainer": 0}, [])
    assert move.ready()
    move.make_reply()
    ckpt = begin({"who": "checkpoint", "trainer": 0}, [])
    assert isinstance(ckpt, Deferred) and not ckpt.ready() and "hand-off phase" in ckpt.describe()
    end({"who": "move"}, [])
    assert ckpt.ready()
    ckpt.make_reply()
    checkpoints.on_leave(0)                          # a chief gone mid-checkpoint holds no turn
    assert checkpoints.turns.checkpoint is None


def test_a_sync_moves_turn_waits_for_the_step_before_its_switch():
    # Holding the turn earlier would keep the chief from checkpointing the steps before, and the
    # hand-off waits for that step anyway: the two would wait for each other.
    _, sparse, checkpoints = service_with_table(Mode.SYNC)
    move = checkpoints.handle_exclude_begin({"who": "move", "after_step": 2}, [])
    assert isinstance(move, Deferred) and not move.ready() and "step 1 is not complete" in move.describe()
    train(sparse, steps=2)
    assert move.ready()


def test_a_moves_drop_waits_for_a_snapshot_read_in_pages():
    ctx, sparse, checkpoints = service_with_table()
    train(sparse)
    guard = checkpoints.hooks()[1]
    checkpoints.handle_snapshot_sparse({"table": "t", "start": 0, "count": 3}, [])       # more pages follow
    finish = Incoming("migrate_finish", {}, None, held="frames of migrate_finish")
    assert guard.admit(finish) is Verdict.HOLD and ctx.resubmitted == []
    rows = sparse.table("t").num_rows
    checkpoints.handle_snapshot_sparse({"table": "t", "start": 3, "count": rows}, [])     # the last page
    guard.tick()
    assert ctx.resubmitted == ["frames of migrate_finish"]
    assert guard.admit(finish) is Verdict.ACCEPT


def test_the_async_cut_reports_each_trainers_routing_for_servers_that_joined_mid_job():
    _, _, checkpoints = service_with_table()
    hook = checkpoints.hooks()[0]
    hook.applied(Incoming("push_sparse", {"step": 3, "table": "t", "routing": 2}, 0))
    hook.applied(Incoming("push_sparse", {"step": 4, "table": "t", "routing": 5}, 1))
    hook.applied(Incoming("push_dense", {"step": 4, "routing": 6}, 1))
    assert checkpoints.handle_pause_pushes({}, []).fields["routings"] == [["dense", 1, 6], ["sparse:t", 0, 2],
                                                                           ["sparse:t", 1, 5]]
    # The chief says which (stream, trainer) pairs route elsewhere: they are not waited for.
    waits = checkpoints.handle_cut_pushes({"cut": [[0, 3], [1, 9]], "skip": [["sparse:t", 1]]}, [])
    assert waits.ready()
    with pytest.raises(ConfigError, match="skip"):
        checkpoints.handle_cut_pushes({"cut": [[0, 3]], "skip": [[1, "sparse:t"]]}, [])
