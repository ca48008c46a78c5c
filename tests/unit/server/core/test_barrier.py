"""server/core/barrier.py: Membership and StepBarrier, the elastic rules (injected clock, no sockets).

The oracle for sync elastic steps: a block's update at step k is the average of exactly the
gradients of the trainers that pushed step k (DenseStore with SGD lr 1: values move by minus
that average)."""
import numpy as np
import pytest

from paramshard.errors import ConfigError
from paramshard.optim import SGD
from paramshard.server.core.barrier import Membership, StepBarrier
from paramshard.server.storage.dense_store import DenseStore


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def elastic(n=3, minimum=1, grace=10.0):
    clock = Clock()
    return Membership(n, grace=grace, clock=clock, min_trainers=minimum), clock


def store_of(membership, values=(0.0, 0.0)):
    store = DenseStore("sync", membership)
    store.register(0, ["w"], [np.array(values, np.float32)], SGD(lr=1.0), plan_fingerprint=1)
    return store


def push(store, trainer, step, grad):
    store.push(trainer, step, ["w"], [np.array(grad, np.float32)])


def test_not_elastic_a_lost_trainer_stays_required():
    m = Membership(2, grace=10.0, clock=Clock())
    assert not m.elastic
    m.connection_lost(1)
    assert m.required == {0, 1} and m.failed == {1}
    with pytest.raises(ConfigError, match="not elastic"):
        m.join(1, 3)


def test_elastic_a_lost_trainer_is_no_longer_required_and_the_step_completes():
    m, _ = elastic(3)
    store = store_of(m)
    push(store, 0, 0, [1.0, 2.0])
    push(store, 1, 0, [3.0, 4.0])
    assert store.blocks["w"].version == 0 and store.waiting_for(["w"]) == [2]
    assert m.connection_lost(2)
    store.on_leave(2)         # what the server does on a lost connection in an elastic job
    assert store.blocks["w"].version == 1
    np.testing.assert_array_equal(store.blocks["w"].values, -np.array([2.0, 3.0], np.float32))


def test_a_lost_trainer_that_pushed_the_step_counts_in_its_average():
    m, _ = elastic(3)
    store = store_of(m)
    push(store, 2, 0, [6.0, 6.0])
    m.connection_lost(2)
    store.on_leave(2)
    assert store.blocks["w"].version == 0          # 0 and 1 still to push
    push(store, 0, 0, [0.0, 0.0])
    push(store, 1, 0, [3.0, 0.0])
    np.testing.assert_array_equal(store.blocks["w"].values, -np.array([3.0, 2.0], np.float32))


def test_a_joiner_is_required_from_its_first_step_only():
    m, _ = elastic(3)
    m.connection_lost(2)
    store = store_of(m)
    push(store, 0, 0, [1.0, 1.0])
    m.join(2, 1)                       # mid-step 0: required from step 1
    assert store.waiting_for(["w"]) == [1]
    push(store, 1, 0, [3.0, 3.0])
    assert store.blocks["w"].version == 1
    np.testing.assert_array_equal(store.blocks["w"].values, [-2.0, -2.0])
    with pytest.raises(ConfigError, match="joined from step 2"):
        m.join(2, 2)
        push(store, 2, 1, [0.0, 0.0])
    m.join(2, 1)
    push(store, 0, 1, [1.0, 0.0])
    push(store, 1, 1, [2.0, 0.0])
    assert store.blocks["w"].version == 1 and store.waiting_for(["w"]) == [2]
    push(store, 2, 1, [6.0, 3.0])
    assert store.blocks["w"].version == 2
    np.testing.assert_array_equal(store.blocks["w"].values, [-5.0, -3.0])


def test_join_takes_any_slot_state_back_to_live():
    m, clock = elastic(3)
    for t in range(3):
        m.note_request(t)
    m.leave(0)
    m.connection_lost(1)
    clock.now = 100.0
    assert m.expire() == [1] and m.gone == {1}
    for t in (0, 1):
        m.join(t, 5)
    assert m.live == {0, 1, 2} and not m.left and not m.gone and m.first_step == {0: 5, 1: 5}
    assert m.required_for(4) == {2} and m.required_for(5) == {0, 1, 2}
    with pytest.raises(ConfigError, match="steps start at 0"):
        m.join(0, -1)


def test_elastic_job_ends_when_every_live_trainer_left_and_enough_left():
    m, _ = elastic(3, minimum=2)
    m.connection_lost(2)
    m.leave(0)
    assert not m.job_over()
    m.leave(1)
    assert m.enough_left() and m.job_over()


def test_step_barrier_describes_what_the_step_waits_for():
    m, _ = elastic(3)
    b = StepBarrier(m, "block w")
    b.check_arrival(0, 4, 4)
    b.arrive(0)
    m.join(1, 5)
    assert b.waiting_for() == [2] and not b.complete()
    m.connection_lost(2)
    assert b.complete()
    b.reset()
    assert b.step is None and b.waiting_for() == [0, 1]


def test_a_join_asked_again_from_a_later_step_releases_the_step_it_held():
    """client/control.join asks again when another server moved on: the step that waited for the
    joiner under its first answer completes once the joiner names a later step."""
    from paramshard.server.core.control_handlers import ControlHandlers
    from paramshard.server.services.dense_handlers import DenseHandlers
    from tests.unit.server_fakes import context
    ctx = context(trainers=3, min_trainers=1)
    store = store_of(ctx.membership)
    ctx.services.append(DenseHandlers(store))
    control = ControlHandlers(ctx)
    ctx.membership.connection_lost(2)
    assert control.handle_join({"trainer": 2, "first_step": 1}, []).fields["joined"]
    push(store, 0, 0, [1.0, 1.0])
    push(store, 1, 0, [1.0, 1.0])
    push(store, 0, 1, [1.0, 1.0])
    push(store, 1, 1, [1.0, 1.0])
    assert store.blocks["w"].version == 1 and store.waiting_for(["w"]) == [2]
    assert control.handle_join({"trainer": 2, "first_step": 2}, []).fields["joined"]
    assert store.blocks["w"].version == 2


def test_elastic_a_slot_never_heard_from_is_not_waited_for_after_the_grace_period():
    m, clock = elastic(3, grace=10.0)
    m.note_request(0)
    m.note_request(1)
    assert m.required == {0, 1, 2}         # trainer 2 may still be starting
    clock.now = 10.0
    assert m.required == {0, 1}            # it died before its first request: no connection ever dropped
    m.join(2, 4)
    assert m.required == {0, 1, 2}
