"""server/services/learning_rates.py (the ``scale_lr`` op) on a ServerContext, no sockets.

Oracle: a sync server whose chief scales the rate at step k holds exactly what the update
rules give when steps before k run at the registered rate and steps from k at the scaled one
(the rules themselves equal torch.optim: test_optimizers.py). The scale is checkpointed state:
a snapshot carries it, a restore brings it back, a reset forgets it.
"""
import re

import numpy as np
import pytest

import paramshard as ps
from paramshard.errors import ConfigError, ProtocolError
from paramshard.mode import Mode
from paramshard.placement.sparse_hash import initial_rows
from paramshard.server.services.checkpoint_service import CheckpointService
from paramshard.server.services.dense_handlers import DenseHandlers
from paramshard.server.storage.dense_store import DenseStore
from paramshard.server.services.learning_rates import LearningRates
from paramshard.server.core.replies import Deferred, Reply
from paramshard.server.storage.row_stores import store_named
from paramshard.server.services.sparse_service import SparseService
from paramshard.tables import Admission, Eviction, policy_to_wire
from paramshard.transport.protocol import validate_request
from paramshard.update_rules import make_rule

from tests.unit.server_fakes import context

DENSE_OPT, TABLE_OPT = ps.optim.Momentum(lr=0.1, momentum=0.5), ps.optim.Adagrad(lr=0.2)
IDS = np.array([3, 17, 40], np.uint64)
DIM = 2


class Server:
    def __init__(self, store="numpy", trainers=2):
        self.ctx = context(Mode.SYNC, trainers=trainers)
        self.dense = DenseStore(Mode.SYNC, self.ctx.membership)
        self.sparse = SparseService(Mode.SYNC, self.ctx.membership, store=store_named(store))
        self.rates = LearningRates(self.dense, self.sparse)
        self.checkpoints = CheckpointService(self.dense, self.sparse, self.ctx)

    def register(self):
        self.dense.register(0, ["w.block0"], [np.zeros(4, np.float32)], DENSE_OPT, plan_fingerprint=1)
        self.sparse.handle_register_sparse({"table": "t", "trainer": 0, "dim": DIM, "seed": 5,
                                            "optimizer": TABLE_OPT.to_wire(),
                                            "policy": policy_to_wire(Admission(), Eviction(), 0.1)}, [])
        self.sparse.handle_pull_sparse({"table": "t", "trainer": 0, "min_version": 0}, [IDS]).make_reply()
        return self

    def push(self, trainer, step, grad):
        self.dense.push(trainer, step, ["w.block0"], [np.full(4, grad, np.float32)])
        self.sparse.handle_push_sparse({"table": "t", "trainer": trainer, "step": step, "distinct": True},
                                       [IDS, np.full((len(IDS), DIM), grad, np.float32)])

    def scale(self, factor, trainer=0, dense=True, tables=("t",), min_version=None):
        header = {"op": "scale_lr", "factor": factor, "dense": dense, "tables": list(tables), "trainer": trainer}
        if min_version is not None:
            header["min_version"] = min_version
        validate_request(header)
        return self.rates.handle_scale_lr(header, [])

    def rows(self):
        table = self.sparse.tables["t"]
        return table.store.gather(table.store.lookup(IDS))


def expected(grads_per_step, change_at, factor):
    """What the rules give: per step the trainers' mean gradient, at the scaled rate from ``change_at``."""
    w, rows = np.zeros(4, np.float32), initial_rows(5, IDS, DIM, 0.1)
    w_slots, r_slots = make_rule(DENSE_OPT).init_slots(w.shape), make_rule(TABLE_OPT).init_slots((len(IDS), DIM))
    for step, grads in enumerate(grads_per_step):
        scale = factor if step >= change_at else 1.0
        dense = make_rule(ps.optim.scaled(DENSE_OPT, scale))
        table = make_rule(ps.optim.scaled(TABLE_OPT, scale))
        total = np.float32(sum(grads))
        dense.apply(w, np.full(4, total, np.float32), w_slots, step + 1, scale=1.0 / len(grads))
        table.apply(rows, np.full((len(IDS), DIM), total, np.float32), r_slots,
                    np.full((len(IDS), 1), step + 1), scale=1.0 / len(grads))
    return w, rows


@pytest.mark.parametrize("store", ["numpy", "compiled"])
def test_a_change_waits_for_the_step_before_it_and_applies_from_the_next(store):
    server = Server(store).register()
    grads = [(1.0, 3.0), (2.0, -1.0), (0.5, 4.0)]
    server.push(0, 0, grads[0][0]), server.push(1, 0, grads[0][1])
    server.push(0, 1, grads[1][0])                 # the chief finished step 1, trainer 1 has not
    waiting = server.scale(0.25, min_version=2)
    assert isinstance(waiting, Deferred) and not waiting.ready()
    assert "step 2 to complete: trainers [1]" in waiting.describe() and waiting.waits_on() == [1]
    server.push(1, 1, grads[1][1])                 # step 1 completes, at the old rate
    assert waiting.ready()
    assert waiting.make_reply().fields == {"dense": 0.25, "tables": {"t": 0.25}}
    server.push(0, 2, grads[2][0]), server.push(1, 2, grads[2][1])
    want_w, want_rows = expected(grads, change_at=2, factor=0.25)
    np.testing.assert_array_equal(server.dense.blocks["w.block0"].values, want_w)
    np.testing.assert_array_equal(server.rows(), want_rows)
    unchanged_w, _ = expected(grads, change_at=3, factor=0.25)
    assert not np.array_equal(want_w, unchanged_w)            # the oracle tells the rates apart


def test_factors_multiply_and_only_the_named_parts_change():
    server = Server().register()
    assert isinstance(server.scale(0.5), Reply)      # no min_version (async): at once
    reply = server.scale(0.1, dense=False)
    assert reply.fields == {"dense": 0.5, "tables": {"t": 0.05}}
    assert server.dense.blocks["w.block0"].rule.config.lr == 0.1 * 0.5
    assert server.sparse.tables["t"].rule.config.lr == 0.2 * (0.5 * 0.1)
    assert server.sparse.tables["t"].optimizer == TABLE_OPT     # the registered rate: what a re-registration compares


BAD = [   # (fields, error, part of the message)
    ({"trainer": 1}, ConfigError, "only the chief (trainer 0) does"),
    ({"factor": 0.0}, ConfigError, "0 < factor <= 1e+06"),
    ({"factor": -0.5}, ConfigError, "0 < factor <= 1e+06"),
    ({"factor": float("inf")}, ConfigError, "a finite number"),
    ({"factor": float("nan")}, ConfigError, "a finite number"),
    ({"factor": 2e6}, ConfigError, "0 < factor <= 1e+06"),
    ({"factor": 1}, ProtocolError, "field 'factor' must be float"),
    ({"tables": ["t", "nope"]}, ConfigError, "unknown sparse table 'nope'"),
    ({"tables": ["t", "t"]}, ConfigError, "more than once"),
    ({"factor": 1e-40, "tables": []}, ConfigError, "is not a positive float32 number"),
]


@pytest.mark.parametrize("fields,error,message", BAD, ids=[m for _, _, m in BAD])
def test_a_refused_change_changes_nothing(fields, error, message):
    server = Server().register()
    server.dense.set_lr_scale(1e-6)
    fields = {"factor": 0.5, "dense": True, "tables": ["t"], "trainer": 0, **fields}
    with pytest.raises(error, match=re.escape(message)):
        validate_request({"op": "scale_lr", **fields})
        server.rates.handle_scale_lr(fields, [])
    assert server.dense.lr_scale == 1e-6 and server.sparse.tables["t"].lr_scale == 1.0


def test_the_scale_is_checkpointed_restored_and_dropped_by_a_reset():
    server = Server().register()
    server.scale(0.5)
    server.scale(0.5, dense=False)
    dense_reply = server.checkpoints.handle_snapshot_dense({}, [])
    page = server.checkpoints.handle_snapshot_sparse({"table": "t", "start": 0, "count": 100}, [])
    assert dense_reply.fields["lr_scale"] == 0.5 and page.fields["lr_scale"] == 0.25

    def restore(scales):
        fresh = Server()
        fresh.sparse.handle_register_sparse({"table": "t", "trainer": 0, "dim": DIM, "seed": 5,
                                             "optimizer": TABLE_OPT.to_wire(),
                                             "policy": policy_to_wire(Admission(), Eviction(), 0.1)}, [])
        dense_header = {"names": dense_reply.fields["blocks"], "versions": dense_reply.fields["versions"],
                        "slots": dense_reply.fields["slots"], "optimizer": DENSE_OPT.to_wire(),
                        "plan_fingerprint": 1, "trainer": 0}
        sparse_header = {"table": "t", "trainer": 0, "parts": page.fields["parts"], "version": 0, "evicted": 0}
        if scales:        # a checkpoint from before learning-rate scales existed has none
            dense_header["lr_scale"], sparse_header["lr_scale"] = scales
        fresh.checkpoints.handle_restore_dense(dense_header, list(dense_reply.arrays))
        fresh.checkpoints.handle_restore_sparse(sparse_header, list(page.arrays))
        return fresh

    back = restore((0.5, 0.25))
    assert back.dense.lr_scale == 0.5 and back.dense.blocks["w.block0"].rule.config.lr == 0.05
    assert back.sparse.tables["t"].lr_scale == 0.25 and back.sparse.tables["t"].rule.config.lr == 0.05
    before = restore(None)
    assert before.dense.blocks["w.block0"].rule.config.lr == 0.1 and before.sparse.tables["t"].lr_scale == 1.0
    with pytest.raises(ConfigError, match="a learning-rate scale must be a finite number > 0"):
        restore((0.0, 1.0))
    DenseHandlers(server.dense).reset()
    server.sparse.reset()
    assert server.dense.lr_scale == 1.0 and server.dense.optimizer is None
