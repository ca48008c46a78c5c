"""GeoBackend's rounds against a fake of the servers' backend (no sockets): when a round is sent,
what it carries, what the schedule and ``on_round`` are told, and what a pull makes stale."""
import numpy as np
import pytest

import paramshard as ps
from paramshard.client.sparse import TableSpec
from paramshard.client.step import PipelineStats
from paramshard.env import ClusterEnv
from paramshard.geo.pacing import Pacer
from paramshard.geo.schedule import FixedK
from paramshard.trainer.backends.geo import SERVER_OPTIMIZER, GeoBackend


class FakeServers:
    """The servers as geo mode runs them: SGD(lr=1) on what is pushed, rows created at zero."""

    def __init__(self):
        self.dense, self.rows, self.pushes, self.pulls = {}, {}, [], []
        self.stats = PipelineStats()
        self.ready = True           # a round's replies are in as soon as it is sent
        self.waits = 0              # flush(): the trainer waited for the replies
        self.steps = self
        self.sparse = self

    # ServerBackend
    def start(self, values, optimizer, tables, ckpt, is_chief):
        assert optimizer == SERVER_OPTIMIZER and all(t.optimizer == SERVER_OPTIMIZER for t in tables.values())
        self.dense = {n: v.copy() for n, v in values.items()}
        return 0

    def flush(self):
        self.waits += 1
        self.ready = True

    def pull_dense(self, values, min_version):
        for n, v in self.dense.items():
            values[n][:] = v
        return 0

    # StepClient
    def push(self, grads, sparse_grads, step, values, wait=True, with_riders=True):
        self.pushes.append((step, {n: g.copy() for n, g in grads.items()}, sparse_grads))
        for n, g in grads.items():
            self.dense[n] -= g
            values[n][:] = self.dense[n]
        for _, ids, g in sparse_grads:
            for i, row in zip(ids.tolist(), g):
                self.rows[i] = self.rows.get(i, 0) - row

    def pushes_answered(self):
        return self.ready

    def pull_after_push(self, table, ids):
        return self.pull_sparse(table, ids, 2, 0)       # the rows as they are after the push

    def pulled(self, fetch):
        return self.ready

    def take_pulled(self, table, fetch, dim):
        return fetch

    def discard_pulled(self, fetch):
        pass

    # SparseClient
    def pull_sparse(self, table, ids, dim, min_version, create=True):
        self.pulls.append(ids.tolist())
        return np.array([self.rows.setdefault(i, np.zeros(dim, np.float32)) for i in ids.tolist()], np.float32)


class Wild(FixedK):
    def next_k(self, done):
        return self.bound + 1


def backend(schedule, trainers=2, send="overlapped"):
    env = ClusterEnv(role="trainer", servers=("127.0.0.1:1",), mode="geo", num_trainers=trainers, geo_send=send)
    b = GeoBackend(env, FakeServers(), schedule)
    values = {"w": np.array([1.0, 2.0], np.float32)}
    b.start(values, ps.optim.SGD(lr=0.5), {"emb": TableSpec("emb", 2, ps.optim.SGD(lr=0.5))}, None, True)
    return b, values


def step(b, values, k, ids=(3, 4)):
    ids = np.array(ids, np.uint64)
    b.rows("emb", ids, 2, k, True)
    b.push({"w": np.ones(2, np.float32)}, [("emb", ids, np.ones((len(ids), 2), np.float32))], k, values)


def test_a_round_every_k_steps_and_the_rest_at_flush():
    b, values = backend(FixedK(3))
    seen = []
    b.on_round = lambda r, next_k, s: seen.append((r.steps, next_k, s))
    for k in range(7):
        step(b, values, k)
    assert [p[0] for p in b.servers.pushes] == [3, 6]
    b.flush()
    assert seen == [(3, 3, 3), (3, 3, 6), (1, 3, 7)]
    # each round carries -(local change) / 2: 3 steps of lr 0.5 x gradient 1 = -1.5, halved
    np.testing.assert_array_equal(b.servers.pushes[0][1]["w"], [0.75, 0.75])
    # and the trainer holds the merged values: 1 + 7 steps' changes, each halved
    np.testing.assert_array_equal(values["w"], [1.0 - 7 * 0.25, 2.0 - 7 * 0.25])
    assert b.last_round.bytes_sent > 0 and b.last_round.delta_norm == pytest.approx(0.5 * np.sqrt(2 + 4))


def test_a_schedule_over_its_bound_is_a_bug_named():
    b, values = backend(Wild(1, bound=1))
    step(b, values, 0)                      # sent: the schedule is asked when its merge lands
    with pytest.raises(AssertionError, match="outside 1..1"):
        step(b, values, 1)


def test_rows_touched_in_a_round_stay_held_and_a_pull_makes_every_row_read_afresh():
    b, values = backend(FixedK(1))
    step(b, values, 0, ids=(3, 4))
    pulls = len(b.servers.pulls)
    step(b, values, 1, ids=(3, 4))          # merged at the round's end: read from the replica
    assert len(b.servers.pulls) == pulls + 1          # only the round's own pull of what it touched
    b.pull_dense(values, 0)
    step(b, values, 2, ids=(3,))
    assert b.servers.pulls[-2] == [3]                 # read afresh after Trainer.pull


def test_a_pause_between_steps_is_no_rounds_compute(monkeypatch):
    """An evaluation between two steps (``paused``) would read as slow steps: auto-k would shrink
    k for it. A fake clock: 1 s a step, 100 s paused inside the round; the round measures 2 s."""
    import paramshard.trainer.backends.geo as geo
    now = [0.0]
    monkeypatch.setattr(geo.time, "perf_counter", lambda: now[0])
    b, values = backend(FixedK(2))
    seen = []
    b.on_round = lambda r, next_k, s: seen.append(r)
    now[0] += 1.0
    step(b, values, 0)
    with b.paused():
        now[0] += 100.0
    now[0] += 1.0
    step(b, values, 1)
    b.flush()           # the round lands
    assert [r.steps for r in seen] == [2] and seen[0].compute_seconds == pytest.approx(2.0)


def test_an_overlapped_round_lands_at_the_first_step_its_replies_are_in_and_loses_no_step():
    """k = 2: the round sent after step 2 is still out at step 3 (no replies yet), lands at step 4
    (they came in) with step 3 kept; the servers end at the initial values plus every step's
    change halved, whatever the order the merges came in, and so does the trainer after flush."""
    b, values = backend(FixedK(2, bound=10))
    seen = []
    b.on_round = lambda r, next_k, s: seen.append((r.steps, s, r.staleness))
    step(b, values, 0)
    b.servers.ready = False
    step(b, values, 1)                       # sent; its replies are not in
    assert len(b.servers.pushes) == 1 and seen == []
    step(b, values, 2)                       # trained while the round is out
    assert seen == [] and b.servers.waits == 0
    b.servers.ready = True
    step(b, values, 3)                       # landed (the replies are in), then the next round went out
    assert seen == [(2, 2, 4)]               # 4 steps past the values it started from
    b.flush()
    assert seen == [(2, 2, 4), (2, 4, 2)]
    np.testing.assert_array_equal(b.servers.dense["w"], [1.0 - 4 * 0.25, 2.0 - 4 * 0.25])
    np.testing.assert_array_equal(values["w"], b.servers.dense["w"])
    assert b.servers.rows[3].tolist() == [-1.0, -1.0]        # 4 steps of -0.5, halved


def test_an_overlapped_round_is_waited_for_before_the_replica_passes_the_bound():
    """k = 2, --max-staleness 3: the round sent at step 2 must land before step 4 (the replica
    would be 4 steps past the merge it holds, from step 0): the trainer waits for it at step 3."""
    b, values = backend(FixedK(2, bound=3))
    b.servers.ready = False
    seen = []
    b.on_round = lambda r, next_k, s: seen.append(r.staleness)
    step(b, values, 0)
    step(b, values, 1)                       # sent, not answered
    assert seen == []
    step(b, values, 2)                       # 3 steps past step 0's values: the bound, waited for
    assert seen == [3] and b.servers.waits == 1


def test_a_blocking_send_lands_before_the_next_step():
    b, values = backend(FixedK(2), send="blocking")
    b.servers.ready = False
    seen = []
    b.on_round = lambda r, next_k, s: seen.append((s, r.staleness))
    step(b, values, 0)
    step(b, values, 1)
    assert seen == [(2, 2)]


class OneRow(Pacer):
    """Pieces of one row, whatever the round trips (the pacer's own tests: tests/unit/geo/test_pacing.py)."""

    def __init__(self):
        super().__init__(rows=1)

    def answered(self, round_trip):
        pass


def test_an_overlapped_round_goes_in_pieces_one_a_step_each_under_a_step_of_its_own():
    """k = 8, four rows, pieces of one row (geo/pacing.py): the round sent at step 8 goes as four
    pushes at steps 8-11 (the dense blocks with the first), lands at step 12 once the last is
    answered, and the next round goes at 16 and 17 on; no two pushes share a step (the servers tell a
    resent push from a new one by it), and after flush the servers and the trainer hold the
    initial values plus every step's change / 2."""
    b, values = backend(FixedK(8, bound=100))
    b._pacer = OneRow()
    seen = []
    b.on_round = lambda r, next_k, s: seen.append((s, r.pieces, r.staleness))
    ids = (1, 2, 3, 4)
    for k in range(17):
        step(b, values, k, ids=ids)
    pushes = b.servers.pushes
    assert [p[0] for p in pushes] == [8, 9, 10, 11, 16, 17]
    assert [bool(p[1]) for p in pushes] == [True, False, False, False, True, False]   # dense with the first piece
    assert [len(p[2][0][1]) for p in pushes[:4]] == [1, 1, 1, 1]
    assert seen == [(8, 4, 12)]
    b.flush()
    assert len({p[0] for p in b.servers.pushes}) == len(b.servers.pushes)
    np.testing.assert_array_equal(b.servers.dense["w"], [1.0 - 17 * 0.25, 2.0 - 17 * 0.25])
    np.testing.assert_array_equal(values["w"], b.servers.dense["w"])
    for i in ids:
        np.testing.assert_array_equal(b.servers.rows[i], [-17 * 0.25] * 2)
