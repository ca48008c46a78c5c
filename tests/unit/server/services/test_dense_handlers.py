"""server/services/dense_handlers.py on a DenseStore, no sockets: the sync step's mean, a pull that waits
for it, async replies with staleness and the bounded-staleness wait."""
import numpy as np
import pytest

import paramshard as ps
from paramshard.errors import ConfigError
from paramshard.server.core.barrier import Membership
from paramshard.server.storage.dense_store import DenseStore
from paramshard.server.services.dense_handlers import DenseHandlers
from paramshard.server.core.replies import Deferred, Reply


def handlers(mode, trainers=2, max_staleness=None):
    h = DenseHandlers(DenseStore(mode, Membership(trainers, grace=5.0), max_staleness))
    h.handle_register_dense({"trainer": 0, "names": ["w"], "optimizer": ps.optim.SGD(lr=1.0).to_wire(),
                             "plan_fingerprint": 1}, [np.zeros(2, np.float32)])
    return h


def push(h, trainer, step, grad, **extra):
    header = {"trainer": trainer, "step": step, "names": ["w"], "reply_values": True, **extra}
    return h.handle_push_dense(header, [np.full(2, grad, np.float32)])


def test_sync_applies_the_mean_once_every_trainer_pushed():
    h = handlers("sync")
    pull = h.handle_pull_dense({"names": ["w"], "min_version": 1, "plan_fingerprint": 1}, [])
    first = push(h, 0, 0, 1.0)
    assert isinstance(first, Deferred) and not first.ready() and first.waits_on() == [1]
    assert "trainers [1] have not pushed" in pull.describe()
    push(h, 1, 0, 3.0)
    assert first.ready() and pull.ready()
    np.testing.assert_array_equal(pull.make_reply().arrays[0], [-2.0, -2.0])
    with pytest.raises(ConfigError, match="shard plan"):
        h.handle_pull_dense({"names": ["w"], "min_version": 0, "plan_fingerprint": 2}, [])


def test_async_replies_at_once_with_staleness_and_a_copy():
    h = handlers("async")
    reply = push(h, 0, 0, 1.0)
    assert isinstance(reply, Reply) and reply.fields["staleness"] == 0
    push(h, 0, 1, 1.0)
    assert push(h, 1, 0, 1.0).fields["staleness"] == 1
    assert reply.arrays[0].tolist() == [-1.0, -1.0]             # a snapshot, not the live block
    assert h.stats()["staleness"] == {"0": 2, "1": 1}


def test_the_staleness_bound_holds_the_fast_trainer_until_the_slow_one_catches_up():
    h = handlers("async", max_staleness=0)
    assert isinstance(push(h, 0, 0, 1.0, resume_step=1), Deferred)
    waiting = push(h, 0, 1, 1.0, resume_step=2)
    assert not waiting.ready() and waiting.waits_on() == [1] and "--max-staleness 0" in waiting.describe()
    push(h, 1, 0, 1.0)
    push(h, 1, 1, 1.0)
    assert waiting.ready()


@pytest.mark.parametrize("optimizer", [ps.optim.SGD(lr=0.5), ps.optim.Adam(lr=0.1)])
def test_blocks_exported_and_imported_equal_the_original_with_optimizer_state(optimizer):
    """DenseStore.export_blocks / import_blocks (a move of blocks between servers): the new owner
    holds the same values, slots, version and scale, and goes on exactly as the old one would."""
    old = DenseStore("async", Membership(1, grace=5.0))
    old.register(0, ["w", "v"], [np.arange(4, dtype=np.float32), np.ones(3, np.float32)], optimizer, 7)
    old.set_lr_scale(0.5)
    for step in range(3):
        old.push(0, step, ["w", "v"], [np.full(4, step + 1, np.float32), np.full(3, -1, np.float32)])
    new = DenseStore("async", Membership(1, grace=5.0))
    new.import_blocks(*_export(old, ["w"]))
    assert new.plan_fingerprint == 7 and new.optimizer == optimizer and new.lr_scale == 0.5
    for a, b in ((old.blocks["w"], new.blocks["w"]),):
        assert a.version == b.version == 3
        np.testing.assert_array_equal(a.values, b.values)
        for x, y in zip(a.slots, b.slots):
            np.testing.assert_array_equal(x, y)
    for store in (old, new):
        store.push(0, 3, ["w"], [np.full(4, 2, np.float32)])
    np.testing.assert_array_equal(old.blocks["w"].values, new.blocks["w"].values)
    with pytest.raises(ConfigError, match="already holds"):
        new.import_blocks(*_export(old, ["w"]))
    with pytest.raises(ConfigError, match="different model"):
        other = DenseStore("async", Membership(1, grace=5.0))
        other.register(0, ["u"], [np.zeros(2, np.float32)], optimizer, 8)
        other.import_blocks(*_export(old, ["v"]))
    assert old.drop_blocks(["w"]) == 1 and "w" not in old.blocks and old.registered


def _export(store, names):
    fields, arrays = store.export_blocks(names)
    from paramshard.optim import from_wire
    return (fields["names"], fields["versions"], fields["slots"], arrays, from_wire(fields["optimizer"]),
            fields["plan_fingerprint"], fields["lr_scale"])


def test_export_refuses_a_block_in_the_middle_of_a_sync_step():
    store = DenseStore("sync", Membership(2, grace=5.0))
    store.register(0, ["w"], [np.zeros(2, np.float32)], ps.optim.SGD(lr=1.0), 1)
    store.push(0, 0, ["w"], [np.ones(2, np.float32)])
    with pytest.raises(ConfigError, match="middle of a sync step"):
        store.export_blocks(["w"])
