"""server/core/control_handlers.py and server/core/epoch_check.py on a ServerContext: hello, leave reaching
every service, reset voiding what waits and moving the epoch, shutdown, and the epoch hook."""
import pytest

from paramshard.errors import ConfigError, StaleEpoch
from paramshard.mode import Mode
from paramshard.server.core.control_handlers import ControlHandlers
from paramshard.server.core.epoch_check import EpochCheck
from paramshard.server.core.hooks import Incoming, Verdict
from paramshard.server.core.replies import Deferred, Reply

from tests.unit.server_fakes import Recorded, context


class Heard:
    """A service that records what the control ops tell every service."""
    def __init__(self):
        self.left, self.resets = [], 0

    def on_leave(self, trainer):
        self.left.append(trainer)

    def reset(self):
        self.resets += 1


def handlers(**kw):
    ctx = context(**kw)
    heard = Heard()
    ctx.services.append(heard)
    return ctx, heard, ControlHandlers(ctx)


def test_hello_says_who_the_server_is():
    _, _, control = handlers(mode=Mode.ASYNC, trainers=3, epoch=2)
    assert control.handle_hello({}, []).fields == {"server": 0, "mode": "async", "trainers": 3, "generation": 2}
    assert control.handle_stats({}, []).fields == {"stats": {"server": 0}}


def test_leave_reaches_every_service_once():
    ctx, heard, control = handlers()
    control.handle_leave({"trainer": 1}, [])
    assert heard.left == [1] and ctx.membership.left == {1}
    with pytest.raises(ConfigError, match="already left"):
        control.handle_leave({"trainer": 1}, [])
    assert heard.left == [1]


def test_reset_voids_the_waits_resets_every_service_and_moves_the_epoch():
    ctx, heard, control = handlers()
    answer = Recorded()
    ctx.waiting.add(answer, "pull_dense", Deferred(ready=lambda: False, make_reply=Reply, describe=str))
    assert control.handle_reset({"trainer": 0, "epoch": 1}, []).fields == {"generation": 1}
    assert ctx.epoch == 1 and heard.resets == 1 and len(ctx.waiting) == 0
    assert answer.errors == [("reset", "server 0: the job rolls back to a checkpoint; this pull_dense is void")]


def test_shutdown_stops_once_the_replies_are_out():
    ctx, _, control = handlers()
    assert not ctx.stopping
    control.handle_shutdown({}, [])
    assert ctx.stopping


def test_the_epoch_hook_refuses_data_requests_of_another_epoch():
    ctx, _, control = handlers(epoch=3)
    hook, = control.hooks()
    assert isinstance(hook, EpochCheck)
    assert hook.admit(Incoming("push_dense", {"epoch": 3}, 0)) is Verdict.ACCEPT
    assert hook.admit(Incoming("pull_sparse", {}, 0)) is Verdict.ACCEPT           # no epoch: an old client
    assert hook.admit(Incoming("hello", {"epoch": 1}, 0)) is Verdict.ACCEPT       # control ops have none
    with pytest.raises(StaleEpoch, match="barrier of epoch 2 refused: server 0 is in epoch 3 .the job rolled back"):
        hook.admit(Incoming("barrier", {"epoch": 2}, 0))
    ctx.epoch = -1
    with pytest.raises(StaleEpoch, match="restarted, waiting for the chief"):
        hook.admit(Incoming("push_sparse", {"epoch": 0}, 0))


class Steps(Heard):
    """A service with step barriers: ``done`` steps complete here."""
    def __init__(self, done):
        super().__init__()
        self.done = done

    def steps_done(self):
        return self.done


def test_join_probes_then_joins_from_a_step_not_complete_here():
    ctx, heard, control = handlers(trainers=3, min_trainers=1)
    steps = Steps(7)
    ctx.services.append(steps)
    ctx.membership.connection_lost(2)
    assert control.handle_join({"trainer": 2}, []).fields == {"version": 7}
    assert ctx.membership.live == {0, 1}          # a probe changes nothing
    steps.done = 8                                # step 8 is in progress now: too late to join at 8
    assert control.handle_join({"trainer": 2, "first_step": 8}, []).fields == {"version": 8, "joined": False}
    assert ctx.membership.live == {0, 1} and heard.left == []
    assert control.handle_join({"trainer": 2, "first_step": 9}, []).fields == {"version": 8, "joined": True}
    assert ctx.membership.live == {0, 1, 2} and ctx.membership.first_step == {2: 9}
    assert heard.left == [2] and steps.left == [2]    # what the slot's last process left behind goes


def test_join_is_refused_in_a_job_that_is_not_elastic():
    _, _, control = handlers(trainers=2)
    with pytest.raises(ConfigError, match="not elastic"):
        control.handle_join({"trainer": 1, "first_step": 0}, [])
    with pytest.raises(ConfigError, match="not part of this job"):
        control.handle_join({"trainer": 5}, [])
