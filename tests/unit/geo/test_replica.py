"""geo/replica.py: the local replica's index, its local steps (the servers' rule), a round's
delta and merge, and which rows a forward must pull again."""
import numpy as np
import pytest

import paramshard as ps
from paramshard.errors import ConfigError
from paramshard.geo.replica import DenseReplica, IdIndex, TableReplica
from paramshard.update_rules.rules import make_rule


def test_id_index_finds_every_id_across_rebuilds():
    index, oracle = IdIndex(), {}
    rng = np.random.default_rng(0)
    for _ in range(12):       # 12 x 1500 ids: the hash index is rebuilt several times
        fresh = np.setdiff1d(rng.integers(0, 2**63, 1500, dtype=np.uint64), index.ids[:index.n])
        for i, p in zip(fresh.tolist(), index.add(fresh).tolist()):
            oracle[i] = p
        probe = np.concatenate([index.ids[:index.n][rng.integers(0, index.n, 500)],
                                np.array([2**63 + 5], np.uint64)])
        expected = [oracle.get(i, -1) for i in probe.tolist()]
        assert index.lookup(probe).tolist() == expected
    assert index.n == len(oracle)


def test_local_step_is_the_servers_rule_and_a_round_sends_the_change_over_n():
    opt = ps.optim.Adagrad(lr=0.5)
    t = TableReplica("emb", 2, opt)
    ids = np.array([7, 3], np.uint64)
    start = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    t.put(ids, start)
    grads = np.array([[0.5, -1.0], [2.0, 0.25]], np.float32)
    t.apply(ids, grads)
    expected, slots = start.copy(), make_rule(opt).init_slots((2, 2))
    make_rule(opt).apply(expected, grads, slots, np.ones((2, 1), np.int64), 1.0)
    np.testing.assert_array_equal(t.read(ids), expected)
    pos, sent_ids, sent, norm_sq = t.round_delta(4)
    assert sorted(sent_ids.tolist()) == [3, 7]
    order = [sent_ids.tolist().index(i) for i in (7, 3)]
    # the servers apply ``sent`` with SGD(lr=1): value - sent == value + (local - synced) / 4
    np.testing.assert_array_equal(sent[order], -(expected - start) / np.float32(4))
    assert norm_sq == pytest.approx(float(np.square(expected - start).sum()))
    # The others' change is what the merge holds beyond synced + this trainer's quarter: here +1
    # on each of the 4 values (not merged - local, which would count 3/4 of our own change too).
    synced = start[[0 if i == 7 else 1 for i in sent_ids.tolist()]]
    merged = synced - sent + 1
    norms = t.merged(pos, merged, sent, t.sent(pos))
    np.testing.assert_array_equal(t.read(sent_ids), merged)
    assert norms.drift_sq == pytest.approx(4.0) and norms.value_sq == pytest.approx(float(np.square(merged).sum()))
    assert t.round_delta(4)[0].size == 0       # a new round: nothing touched yet


def test_rows_not_touched_in_a_round_are_pulled_again_keeping_their_slots():
    t = TableReplica("emb", 1, ps.optim.Adagrad(lr=1.0))
    a, b = np.array([1], np.uint64), np.array([2], np.uint64)
    t.put(np.array([1, 2], np.uint64), np.zeros((2, 1), np.float32))
    assert not t.stale(np.array([1, 2], np.uint64)).any()
    t.apply(a, np.ones((1, 1), np.float32))
    pos, _, sent, _ = t.round_delta(1)
    t.merged(pos, t.read(a), sent, t.sent(pos))
    assert t.stale(np.array([1, 2, 9], np.uint64)).tolist() == [False, True, True]   # b: a round old; 9: new
    t.put(b, np.full((1, 1), 5.0, np.float32))
    np.testing.assert_array_equal(t.read(b), [[5.0]])
    before = t.slots[0][t.index.lookup(a)].copy()
    t.forget()                  # Trainer.pull, a rollback: every row is read again ...
    assert t.stale(np.array([1, 2], np.uint64)).all()
    np.testing.assert_array_equal(t.slots[0][t.index.lookup(a)], before)    # ... its optimizer state kept


def test_gradients_for_rows_never_read_are_refused():
    t = TableReplica("emb", 1, ps.optim.SGD(lr=1.0))
    with pytest.raises(ConfigError, match="never read"):
        t.apply(np.array([4], np.uint64), np.ones((1, 1), np.float32))


def test_dense_replica_trains_in_place_and_sends_the_change():
    values = {"w": np.array([1.0, -2.0, 0.5], np.float32)}
    view = values["w"]
    d = DenseReplica(values, ps.optim.SGD(lr=0.5))
    d.apply({"w": np.array([1.0, 1.0, -1.0], np.float32)})
    np.testing.assert_array_equal(view, [0.5, -2.5, 1.0])       # the Trainer's parameters, in place
    sent, norm_sq = d.round_delta(2)
    np.testing.assert_array_equal(sent["w"], [0.25, 0.25, -0.25])
    assert norm_sq == pytest.approx(0.75)
    view[:] = [0.75, -2.25, 0.75]      # merged: synced + our half, nobody else sent
    assert d.merged(sent).drift_sq == 0.0               # alone: nothing missed (merged - local would say 0.1875)
    assert d.round_delta(2)[1] == 0.0
    view[:] = [0.0, 0.0, 0.0]          # next round: nothing trained, the others moved it all to 0
    norms = d.merged({"w": np.zeros(3, np.float32)})
    assert norms.drift_sq == pytest.approx(0.5625 + 5.0625 + 0.5625)
    assert (norms.settled_value_sq, norms.settled_drift_sq) == (norms.value_sq, norms.drift_sq)    # dense: all settled


def test_a_young_row_is_left_out_of_the_settled_drift():
    """Row 1 was created near zero (0.01) and this round's own step moved it by 0.5, more than its
    size; row 2 holds 3.0 and moved by 0.5. The others moved each by +1: over all rows the drift is
    sqrt(2) against values ~4, over the settled row 2 alone it is 1 against its own value."""
    t = TableReplica("emb", 1, ps.optim.SGD(lr=1.0))
    ids = np.array([1, 2], np.uint64)
    t.put(ids, np.array([[0.01], [3.0]], np.float32))
    t.apply(ids, np.array([[-0.5], [-0.5]], np.float32))        # SGD: +0.5 each
    pos, sent_ids, sent, _ = t.round_delta(2)
    synced = np.where(sent_ids == 1, 0.01, 3.0).astype(np.float32)[:, None]
    merged = synced - sent + 1.0                 # this trainer's half of its +0.5, and the others' +1
    norms = t.merged(pos, merged, sent, t.sent(pos))
    assert norms.drift_sq == pytest.approx(2.0) and norms.value_sq == pytest.approx(float(np.square(merged).sum()))
    assert norms.settled_drift_sq == pytest.approx(1.0)
    assert norms.settled_value_sq == pytest.approx(float(merged[sent_ids == 2][0, 0]) ** 2)


def test_an_overlapped_merge_keeps_the_steps_trained_while_the_round_was_out():
    """Sent at 2.0 (synced 1.0, SGD lr 1: one step of -1.0), then one more local step (3.0) before
    the merge lands as 5.0 (the others added 3.5 beside this trainer's half): local becomes 5.0 +
    (3.0 - 2.0), synced 5.0, and the next round sends exactly the step trained since the send."""
    t = TableReplica("emb", 1, ps.optim.SGD(lr=1.0))
    ids = np.array([4], np.uint64)
    t.put(ids, np.array([[1.0]], np.float32))
    t.apply(ids, np.array([[-1.0]], np.float32))
    pos, _, sent, _ = t.round_delta(2)
    at_send = t.sent(pos)
    assert not t.stale(ids).any()              # out on the wire, the row stays this trainer's to train
    t.apply(ids, np.array([[-1.0]], np.float32))
    np.testing.assert_array_equal(t.read(ids), [[3.0]])
    norms = t.merged(pos, np.array([[5.0]], np.float32), sent, at_send)
    np.testing.assert_array_equal(t.read(ids), [[6.0]])
    np.testing.assert_array_equal(t.synced[pos], [[5.0]])
    assert norms.drift_sq == pytest.approx(3.5 ** 2)          # 5.0 - (1.0 + 0.5): the others' change only
    pos2, _, sent2, norm_sq = t.round_delta(2)
    np.testing.assert_array_equal(pos2, pos)
    np.testing.assert_array_equal(sent2, [[-0.5]])            # (6 - 5) / 2: the step since the send, once
    assert norm_sq == pytest.approx(1.0)


def test_an_overlapped_dense_merge_keeps_the_steps_trained_since_the_send():
    values = {"w": np.array([1.0, 2.0], np.float32)}
    d = DenseReplica(values, ps.optim.SGD(lr=1.0))
    d.apply({"w": np.array([-1.0, 0.0], np.float32)})           # [2, 2]
    sent, _ = d.round_delta(1)
    at_send = d.local_copy()
    d.apply({"w": np.array([0.0, -2.0], np.float32)})           # trained on while the round is out: [2, 4]
    merged = {"w": np.array([2.0, 3.0], np.float32)}            # the others moved w[1] by +1
    norms = d.merged(sent, merged, at_send)
    np.testing.assert_array_equal(values["w"], [2.0, 5.0])      # merged + (local now - local at send)
    np.testing.assert_array_equal(d.synced["w"], [2.0, 3.0])
    assert norms.drift_sq == pytest.approx(1.0)
    np.testing.assert_array_equal(d.round_delta(1)[0]["w"], [-0.0, -2.0])
