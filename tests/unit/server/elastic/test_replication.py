"""server/elastic/replication.py (and launch/elastic/replica_copy.py, which folds its deltas) on in-process
servers, no sockets. The oracle: a replica built from deltas taken while two trainers
train, restored onto a restarted server, leaves that server equal to the original
(dense blocks, slots and versions, every sparse row with its optimizer state, update
counts, last-seen versions and admission counters, learning-rate scales, each trainer's
last applied step), whatever the page size and however the replies are cut."""
import numpy as np
import zmq
import pytest

import paramshard as ps
from paramshard.env import ClusterEnv
from paramshard.errors import AlreadyApplied, ConfigError, ProtocolError
from paramshard.launch.elastic.replica_copy import ServerReplica
from paramshard.server.assembly import build_server
from paramshard.server.elastic import replication
from paramshard.server.elastic.replication import DirtyPages, ReplayGuard
from paramshard.server.core.replies import Deferred
from paramshard.server.core.hooks import Incoming
from paramshard.tables import Admission, Eviction, policy_to_wire

DIM = 3
ADAM = ps.optim.Adam(lr=0.01)


def server(recovering=False):
    env = ClusterEnv(role="server", servers=("127.0.0.1:1",), server_id=0, num_trainers=2, mode="async",
                     recovery="bounded-loss", recovering=recovering, row_store="numpy")
    return build_server(env, in_process=True)


def call(s, header, arrays=()):
    out = s.handle_local(header, list(arrays))
    return out.make_reply() if isinstance(out, Deferred) else out


def register(s):
    call(s, {"op": "register_dense", "names": ["a", "b"], "optimizer": ADAM.to_wire(), "plan_fingerprint": 7,
             "trainer": 0}, [np.arange(5, dtype=np.float32), np.ones(20, np.float32)])
    call(s, {"op": "register_sparse", "table": "t", "dim": DIM, "seed": 4, "optimizer": ADAM.to_wire(),
             "policy": policy_to_wire(Admission(min_count=2), Eviction(), 0.1), "trainer": 0})


def train(s, rng, steps, first_step):
    for step in range(first_step, first_step + steps):
        for t in (0, 1):
            call(s, {"op": "push_dense", "names": ["a", "b"], "step": step, "trainer": t, "reply_values": False,
                     "epoch": 0}, [rng.standard_normal(5).astype(np.float32), rng.standard_normal(20).astype(np.float32)])
            ids = np.unique(rng.integers(0, 300, 25).astype(np.uint64))
            call(s, {"op": "pull_sparse", "table": "t", "trainer": t, "min_version": 0, "epoch": 0}, [ids])
            call(s, {"op": "push_sparse", "table": "t", "trainer": t, "step": step, "epoch": 0},
                 [ids, rng.standard_normal((len(ids), DIM)).astype(np.float32)])


def fold(s, replica, since=None):
    """Deltas until nothing more waits, as the keeper does (``replica.seq``: the last reply folded in)."""
    while True:
        reply = call(s, {"op": "replica_delta", "since": getattr(replica, "seq", -1) if since is None else since})
        replica.apply(reply.fields, reply.arrays)
        replica.seq, since = reply.fields["seq"], None
        if not reply.fields["more"]:
            return reply


def state(s):
    dense = call(s, {"op": "snapshot_dense"})
    rows = call(s, {"op": "snapshot_sparse", "table": "t", "start": 0, "count": 10**6})
    parts = dict(zip(rows.fields["parts"], rows.arrays))
    order = np.argsort(parts["ids"])
    sparse = {k: (v[order] if k not in ("counted_ids", "counts") else v) for k, v in parts.items()}
    if "counted_ids" in sparse:
        c = np.argsort(sparse["counted_ids"])
        sparse["counted_ids"], sparse["counts"] = sparse["counted_ids"][c], sparse["counts"][c]
    guard = s.service(replication.ReplicationService).guard.newest()
    return dense.fields, dense.arrays, {k: rows.fields[k] for k in ("rows", "version", "evicted", "lr_scale")}, sparse, guard


@pytest.mark.parametrize("page_rows,max_bytes", [(4096, 32 << 20), (8, 300)])
def test_replica_restored_onto_a_restarted_server_equals_the_original(monkeypatch, page_rows, max_bytes):
    monkeypatch.setattr(replication, "PAGE_ROWS", page_rows)
    monkeypatch.setattr(replication, "MAX_DELTA_BYTES", max_bytes)
    rng = np.random.default_rng(1)
    original, replica = server(), ServerReplica()
    fold(original, replica)                        # before registration: nothing yet
    register(original)
    for round_ in range(5):
        train(original, rng, 3, first_step=3 * round_)
        if round_ == 2:
            original.dense.set_lr_scale(0.5)
            original.service(replication.SparseService).tables["t"].set_lr_scale(0.25)
        fold(original, replica)
    assert replica.complete and replica.dense is not None
    assert replica.applied_updates() == 2 * 2 * 15   # 2 streams (dense, table) x 2 trainers x steps 0..14

    restarted = server(recovering=True)
    assert restarted.generation == -1
    for header, arrays in replica.restore_requests():
        call(restarted, header, arrays)
    assert restarted.generation == 0
    want, got = state(original), state(restarted)
    assert want[0] == got[0]
    for a, b in zip(want[1], got[1]):
        np.testing.assert_array_equal(a, b)
    assert want[2] == got[2]
    assert want[3].keys() == got[3].keys() and "counted_ids" in got[3]
    for k in want[3]:
        np.testing.assert_array_equal(want[3][k], got[3][k], err_msg=k)
    assert want[4] == got[4] == {"dense": {0: 14, 1: 14}, "sparse:t": {0: 14, 1: 14}}

    # A resent push the copy holds is a replay; the next step is applied.
    with pytest.raises(AlreadyApplied, match="step 14"):
        call(restarted, {"op": "push_dense", "names": ["a"], "step": 14, "trainer": 1, "reply_values": False,
                         "epoch": 0}, [np.zeros(5, np.float32)])
    assert restarted.failure_reply("push_dense", AlreadyApplied("x"))[0] == "applied"
    call(restarted, {"op": "push_dense", "names": ["a"], "step": 15, "trainer": 1, "reply_values": False,
                     "epoch": 0}, [np.zeros(5, np.float32)])


def test_a_push_for_a_row_the_copy_lacks_makes_it():
    """Rows made after the last copy died with their server: a push naming one makes it (its first
    pull's values) instead of failing a trainer that pulled it from the old server."""
    original, replica = server(), ServerReplica()
    register(original)
    call(original, {"op": "register_sparse", "table": "u", "dim": DIM, "seed": 4, "optimizer": ADAM.to_wire(),
                    "policy": policy_to_wire(Admission(), Eviction(), 0.1), "trainer": 0})
    fold(original, replica)
    push = {"op": "push_sparse", "table": "u", "trainer": 0, "step": 0, "epoch": 0}
    ids, grads = np.array([5, 6], np.uint64), np.ones((2, DIM), np.float32)
    bare = server()          # a table no copy was taken of yet: such a push is the trainer's mistake
    call(bare, {"op": "register_sparse", "table": "u", "dim": DIM, "seed": 4, "optimizer": ADAM.to_wire(),
                "policy": policy_to_wire(Admission(), Eviction(), 0.1), "trainer": 0})
    with pytest.raises(ConfigError, match="never pulled"):
        call(bare, push, [ids, grads])
    restarted = server(recovering=True)
    for header, arrays in replica.restore_requests():
        call(restarted, header, arrays)
    call(restarted, push, [ids, grads])
    assert restarted.service(replication.SparseService).tables["u"].num_rows == 2


def test_replica_resume_only_onto_a_restarted_server():
    with pytest.raises(ConfigError, match="not restarted"):
        call(server(), {"op": "replica_resume", "epoch": 0, "steps": {}})
    with pytest.raises(ConfigError, match="trainer, step"):
        call(server(recovering=True), {"op": "replica_resume", "epoch": 0, "steps": {"dense": [[0]]}})


def test_dirty_pages_start_whole_then_only_what_changed():
    pages = DirtyPages(page_rows=10)
    assert pages.take(25) == (True, [0, 1, 2])
    assert pages.take(25) == (False, [])
    pages.rows(np.array([3, 4, 21]))
    pages.grew(25, 41)                 # rows 25..40: pages 2, 3, 4
    assert pages.take(41) == (False, [0, 2, 3, 4])
    pages.rows(np.array([11]))
    pages.give_back([4])
    assert pages.take(41) == (False, [1, 4])
    pages.everything()
    pages.rows(np.array([0]))
    assert pages.take(5) == (True, [0])


def test_replay_guard_holds_steps_per_trainer_and_stream_in_any_order(monkeypatch):
    guard = ReplayGuard()

    def push(op, step, trainer=0, table="t"):
        request = Incoming(op, {"step": step, "table": table}, trainer)
        guard.admit(request)
        guard.applied(request)

    push("push_dense", 0)
    push("push_sparse", 0)
    push("push_dense", 2)
    push("push_dense", 1)          # resent after a newer one arrived (pushes in flight): not a replay
    push("push_dense", 0, trainer=1)
    for step in (1, 2):
        with pytest.raises(AlreadyApplied, match=f"step {step}"):
            push("push_dense", step)
    push("push_sparse", 0, table="u")      # another table: its own sequence
    assert guard.wire() == {"dense": [[0, 2], [1, 0]], "sparse:t": [[0, 0]], "sparse:u": [[0, 0]]}
    restored = ReplayGuard()
    restored.restore(guard.wire())         # a copy holds every step up to the newest
    assert restored.holds("dense", 0, 2) and restored.holds("dense", 0, 0) and not restored.holds("dense", 0, 3)
    monkeypatch.setattr(ReplayGuard, "WINDOW", 4)
    for step in range(3, 9):
        push("push_dense", step)
    assert guard.floor["dense"][0] >= 4 and len(guard.recent["dense"][0]) <= 4   # bounded
    assert all(guard.holds("dense", 0, s) for s in range(9)) and not guard.holds("dense", 0, 9)


def test_replay_guard_takes_the_parts_of_a_step_resent_after_a_move():
    # An elastic job: parts of step 5's pushes refused as moved elsewhere go again to this server
    # (other rows, other blocks, a newer routing); a replay of any of them is still refused.
    guard = ReplayGuard()

    def push(op, routing, what):
        header = {"step": 5, "table": "t", "routing": routing, "names": what}
        ids = np.array(what if op == "push_sparse" else [], np.uint64)
        frames = ["identity", "header", zmq.Frame(ids.tobytes())]
        request = Incoming(op, header, 0, held=frames)
        guard.admit(request)
        guard.applied(request)

    pushes = [("push_sparse", 1, [1, 2]), ("push_sparse", 2, [3]), ("push_sparse", 2, [4]),
              ("push_dense", 2, ["w/0"]), ("push_dense", 2, ["b/0"])]
    for p in pushes:
        push(*p)
    for p in pushes:
        with pytest.raises(AlreadyApplied, match="step 5"):
            push(*p)
    assert guard.wire() == {"sparse:t": [[0, 5]], "dense": [[0, 5]]}


def test_replica_refuses_a_reply_whose_arrays_do_not_fit_and_keeps_nothing():
    s = server()
    register(s)
    reply = call(s, {"op": "replica_delta", "since": -1})
    replica = ServerReplica()
    with pytest.raises(ProtocolError, match="block"):
        replica.apply(reply.fields, reply.arrays[1:])
    with pytest.raises(ProtocolError, match="more than"):
        replica.apply(reply.fields, [*reply.arrays, np.zeros(1, np.float32)])
    assert replica.blocks == {} and not replica.complete


def test_a_lost_reply_or_a_second_caller_makes_the_next_delta_whole():
    s, replica = server(), ServerReplica()
    register(s)
    train(s, np.random.default_rng(2), 2, first_step=0)
    assert fold(s, replica).fields["full"]
    train(s, np.random.default_rng(3), 1, first_step=2)
    assert not fold(s, replica).fields["full"]
    call(s, {"op": "replica_delta", "since": replica.seq})     # taken by someone else (or lost on the way)
    train(s, np.random.default_rng(4), 1, first_step=3)
    assert fold(s, replica).fields["full"]
    restarted = server(recovering=True)
    for header, arrays in replica.restore_requests():
        call(restarted, header, arrays)
    want, got = state(s), state(restarted)
    assert want[4] == got[4] and want[2] == got[2]
    for k in want[3]:
        np.testing.assert_array_equal(want[3][k], got[3][k], err_msg=k)
