"""A dense block moves (server/elastic/dense_migration.py) while a reply about it waits in the server's
WaitingList (issue 29). Server objects in this process, as tests/unit/server/elastic/test_dense_migration.py.

Async bounded staleness: trainer 0's push is applied at once and its reply waits for the gate
(trainer 1 to finish the step). The block is frozen, handed to a new owner and dropped before
trainer 1 pushes (its push goes to the new owner). The oracle is a store that never moved and
received the same pushes: the waiting reply is answered (not an error, not ``moved``: the push
was applied and must not be sent again), and the values trainer 0 then gets through the gate at
the new owner equal the oracle's after both pushes of the step.

Sync: the push+pull reply of step S - 1 waits for the step to complete; the old owner's freeze
waits for the same completion, and one pass of the WaitingList answers them together, so the
reply has its values before the freeze is answered and so before any dense_finish."""
from __future__ import annotations

from collections import Counter

import numpy as np

import paramshard as ps
from paramshard.mode import Mode
from paramshard.placement.partitions import Routing
from paramshard.server.core.barrier import Membership
from paramshard.server.core.context import ServerContext
from paramshard.server.services.dense_handlers import DenseHandlers
from paramshard.server.elastic.dense_migration import DenseMigration
from paramshard.server.storage.dense_store import DenseStore
from paramshard.server.elastic.migration_service import MigrationService
from paramshard.server.core.replies import Deferred, Reply
from paramshard.server.services.sparse_service import SparseService
from paramshard.server.core.waiting import WaitingList

OPT = ps.optim.Adam(lr=0.1)
START = {"w": np.arange(3, dtype=np.float32), "v": np.ones(3, np.float32)}


class Answers:
    """Where one waiting request's answer goes (server/core/waiting.py's Answer)."""

    def __init__(self, log: list, what: str):
        self.log, self.what = log, what

    def reply(self, reply: Reply) -> None:
        self.log.append((self.what, "reply", reply))

    def error(self, code: str, message: str) -> None:
        self.log.append((self.what, code, message))

    def failure(self, op: str, exc: Exception) -> None:
        self.log.append((self.what, "failure", exc))


def _server(server_id: int, mode: Mode, bound: int | None = None):
    membership = Membership(2, grace=5.0)
    waiting = WaitingList(f"server {server_id}", membership, 5.0, Counter())
    context = ServerContext(server_id, mode, membership, 5.0, waiting, resubmit=lambda request: None)
    migration = MigrationService(context, SparseService(mode.value, membership),
                                 Routing.initial(16, ["a:1", "b:2"]))
    dense = DenseStore(mode, membership, max_staleness=bound)
    return DenseMigration(context, dense, migration), DenseHandlers(dense), waiting


def _grad(trainer: int, step: int) -> np.ndarray:
    return np.full(3, 1.0 + trainer + 10 * step, np.float32)


def _push(handlers, trainer: int, step: int, names: list, resume: int | None = None):
    header = {"trainer": trainer, "step": step, "names": names, "reply_values": True}
    if resume is not None:
        header["resume_step"] = resume
    return handlers.handle_push_dense(header, [_grad(trainer, step) for _ in names])


def _run(waiting: WaitingList, log: list, what: str, outcome) -> None:
    """What the server loop does with a handler's outcome: answer now or wait."""
    if isinstance(outcome, Deferred):
        waiting.add(Answers(log, what), what, outcome)
    else:
        log.append((what, "reply", outcome))
    waiting.answer_ready()


def _move(old: DenseMigration, new: DenseMigration, names: list, log: list) -> None:
    new.handle_dense_expect({"names": names}, [])
    _run(old.ctx.waiting, log, "freeze", old.handle_dense_freeze({"names": names}, []))
    reply = old.handle_dense_export({"names": names}, [])
    new.handle_dense_import({**reply.fields, "lr_scale": float(reply.fields["lr_scale"])}, reply.arrays)
    old.handle_dense_finish({}, [])
    old.ctx.waiting.answer_ready()


def _oracle(mode: Mode, pushes: list) -> DenseStore:
    store = DenseStore(mode, Membership(2, grace=5.0))
    store.register(0, list(START), [a.copy() for a in START.values()], OPT, 9)
    for trainer, step in pushes:
        store.push(trainer, step, list(START), [_grad(trainer, step) for _ in START])
    return store


def test_async_bounded_reply_waiting_while_its_block_moves_is_answered_once_and_gated_at_the_new_owner():
    old, old_h, old_wait = _server(0, Mode.ASYNC, bound=0)
    new, new_h, new_wait = _server(1, Mode.ASYNC, bound=0)
    old.dense.register(0, list(START), [a.copy() for a in START.values()], OPT, 9)
    log: list = []
    _run(old_wait, log, "push t0", _push(old_h, 0, 0, ["w", "v"], resume=1))
    assert log == [], "trainer 0 is a step ahead of trainer 1: its reply waits (--max-staleness 0)"

    _move(old, new, ["w"], log)
    # Trainer 1's step 0: "w" at its new owner, "v" still at the old one.
    _run(new_wait, log, "push t1 w", _push(new_h, 1, 0, ["w"]))
    _run(old_wait, log, "push t1 v", _push(old_h, 1, 0, ["v"]))

    answers = [entry for entry in log if entry[0] == "push t0"]
    assert len(answers) == 1 and answers[0][1] == "reply", f"the push's reply failed: {answers}"
    reply = answers[0][2]
    assert reply.fields.get("follow") == 1 and not reply.arrays, \
        "the push was applied once: the reply says where to take the values, it does not ask to resend"
    assert old.dense.blocks["v"].version == new.dense.blocks["w"].version == 2, "each push applied once"

    # The trainer (client/dense.py catch_up) pulls what it pushed from the owners, gated at step 1.
    oracle = _oracle(Mode.ASYNC, [(0, 0), (1, 0)])
    for handlers, waiting, name in ((new_h, new_wait, "w"), (old_h, old_wait, "v")):
        got: list = []
        _run(waiting, got, "pull", handlers.handle_pull_dense(
            {"names": [name], "min_version": 0, "plan_fingerprint": 9, "resume_step": 1}, []))
        [(_, kind, pulled)] = got
        assert kind == "reply"
        np.testing.assert_array_equal(pulled.arrays[0], oracle.blocks[name].values)


def test_the_gate_at_the_new_owner_waits_for_the_laggard_only():
    """The new owner takes the old one's clocks with the blocks (dense_import): trainer 0, whose
    last push went to the old owner, is not waited for again (it would wait for itself)."""
    old, old_h, old_wait = _server(0, Mode.ASYNC, bound=0)
    new, new_h, new_wait = _server(1, Mode.ASYNC, bound=0)
    old.dense.register(0, list(START), [a.copy() for a in START.values()], OPT, 9)
    log: list = []
    _run(old_wait, log, "push t0", _push(old_h, 0, 0, ["w", "v"], resume=1))
    _move(old, new, ["w"], log)
    pulled: list = []
    _run(new_wait, pulled, "pull", new_h.handle_pull_dense(
        {"names": ["w"], "min_version": 0, "plan_fingerprint": 9, "resume_step": 1}, []))
    assert pulled == [] and new.dense.clocks.laggards(1) == [1]
    _run(new_wait, log, "push t1 w", _push(new_h, 1, 0, ["w"]))
    [(_, kind, reply)] = pulled
    assert kind == "reply"
    np.testing.assert_array_equal(reply.arrays[0], _oracle(Mode.ASYNC, [(0, 0), (1, 0)]).blocks["w"].values)


def test_the_gate_waits_for_every_part_of_a_step_that_reaches_one_server_in_two_pushes():
    """A trainer's step can reach one server in parts: its push was refused as ``moved`` by two
    old owners, and each refusal is split again and resent (client/dense.py settle). The gate of
    a pull of both blocks opens only when both parts are in: a trainer clock ticked by the first
    part gave trainer 0 values without trainer 1's gradient of the other block (CI, stop 40)."""
    old, old_h, old_wait = _server(0, Mode.ASYNC, bound=0)
    new, new_h, new_wait = _server(1, Mode.ASYNC, bound=0)
    old.dense.register(0, list(START), [a.copy() for a in START.values()], OPT, 9)
    log: list = []
    _run(old_wait, log, "push t0", _push(old_h, 0, 0, ["w", "v"], resume=1))
    _move(old, new, ["w", "v"], log)
    pulled: list = []
    _run(new_wait, pulled, "pull", new_h.handle_pull_dense(
        {"names": ["w", "v"], "min_version": 0, "plan_fingerprint": 9, "resume_step": 1}, []))
    _run(new_wait, log, "push t1 w", _push(new_h, 1, 0, ["w"]))
    assert pulled == [], "trainer 1's step 0 is not in block v yet: the gate must stay shut"
    assert new.dense.clocks.laggards(1, ["w", "v"]) == [1] and new.dense.clocks.laggards(1, ["w"]) == []
    _run(new_wait, log, "push t1 v", _push(new_h, 1, 0, ["v"]))
    [(_, kind, reply)] = pulled
    assert kind == "reply"
    oracle = _oracle(Mode.ASYNC, [(0, 0), (1, 0)])
    for name, values in zip(["w", "v"], reply.arrays):
        np.testing.assert_array_equal(values, oracle.blocks[name].values)


def test_a_moved_block_takes_its_own_clocks_not_its_old_owners():
    """The old owner had trainer 1's step 0 in block v but not yet in w (its part for w was
    refused and resent elsewhere): the new owner of w must still wait for it."""
    old, old_h, old_wait = _server(0, Mode.ASYNC, bound=0)
    new, new_h, new_wait = _server(1, Mode.ASYNC, bound=0)
    old.dense.register(0, list(START), [a.copy() for a in START.values()], OPT, 9)
    log: list = []
    _run(old_wait, log, "push t0", _push(old_h, 0, 0, ["w", "v"], resume=1))
    _run(old_wait, log, "push t1 v", _push(old_h, 1, 0, ["v"]))
    _move(old, new, ["w"], log)
    assert "w" not in old.dense.clocks.block_clock, "the clocks of a block handed away went with it"
    assert new.dense.clocks.laggards(1, ["w"]) == [1]
    assert new.dense.clocks.fastest() == 1


def test_sync_push_reply_is_answered_with_its_values_before_the_freeze_can_be():
    """Sync cannot meet the defect: the freeze and the push+pull replies of the steps before the
    switch wait for the same step completion, and a WaitingList pass answers all that is ready."""
    old, old_h, old_wait = _server(0, Mode.SYNC)
    new, _, _ = _server(1, Mode.SYNC)
    old.dense.register(0, list(START), [a.copy() for a in START.values()], OPT, 9)
    for service in (old, new):
        service.migration.ownership.arm(1, 1)          # the switch: step 1
    log: list = []
    _run(old_wait, log, "push t0", _push(old_h, 0, 0, ["w", "v"]))
    new.handle_dense_expect({"names": ["w"]}, [])
    _run(old_wait, log, "freeze", old.handle_dense_freeze({"names": ["w"]}, []))
    assert log == [], "the freeze waits for step 0 to complete, as the reply does"
    _run(old_wait, log, "push t1", _push(old_h, 1, 0, ["w", "v"]))
    # One pass (the server loop runs a whole pass between two requests, so no dense_finish comes
    # in between) answered the freeze and both push replies, with their values.
    assert sorted((what, kind) for what, kind, _ in log) == [("freeze", "reply"), ("push t0", "reply"),
                                                             ("push t1", "reply")]
    oracle = _oracle(Mode.SYNC, [(0, 0), (1, 0)])
    for _, _, reply in [entry for entry in log if entry[0] != "freeze"]:
        for name, values in zip(["w", "v"], reply.arrays):
            np.testing.assert_array_equal(values, oracle.blocks[name].values)
    reply = old.handle_dense_export({"names": ["w"]}, [])
    new.handle_dense_import({**reply.fields, "lr_scale": float(reply.fields["lr_scale"])}, reply.arrays)
    old.handle_dense_finish({}, [])
    assert not len(old_wait), "nothing waits on the dropped block"
