"""server/elastic/shard_service.py: server 0 only, stale job epochs refused, a lost trainer's task
back in the queue once its grace period ran out (injected clock), a left one's at once,
sync next waits for the reports of the step before, snapshots wait for the cut's reports."""
import pytest

from paramshard.errors import ConfigError, StaleEpoch
from paramshard.mode import Mode
from paramshard.server.core.barrier import Membership
from paramshard.server.core.context import ServerContext
from paramshard.server.core.replies import Deferred, Reply
from paramshard.server.elastic.shard_service import ShardService
from paramshard.server.core.waiting import WaitingList

TASKS = [[0, 0, 10, 0], [0, 10, 20, 0]]


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


def service(trainers=3, server_id=0, mode=Mode.ASYNC, min_trainers=None):
    clock = Clock()
    membership = Membership(trainers, grace=5.0, clock=clock, min_trainers=min_trainers)
    context = ServerContext(server_id, mode, membership, 5.0, WaitingList("s", membership, 5.0, {}))
    s = ShardService(context)
    for t in range(trainers):
        membership.note_request(t)
    return s, membership, clock


def call(s, op, **fields):
    out = s.ops()[op]({"op": op, **fields}, [])
    if isinstance(out, Deferred):
        return out
    assert isinstance(out, Reply)
    return out.fields


def register(s, trainer=0):
    return call(s, "shard_register", trainer=trainer, **{"pass": 1}, fingerprint="f", files=["a"], tasks=TASKS)


def nxt(s, trainer, **kw):
    return call(s, "shard_next", trainer=trainer, **{"pass": 1}, **kw)


def test_a_lost_trainer_gives_its_task_back_after_the_grace_period_and_a_leaving_one_at_once():
    s, membership, clock = service()
    assert register(s)["registered"] == "registered" and register(s, 1)["registered"] == "same"
    assert nxt(s, 0)["task"] == [0, 0, 0, 10, 0]
    assert nxt(s, 1)["task"] == [1, 0, 10, 20, 0]
    call(s, "shard_progress", trainer=0, **{"pass": 1}, step=0, task=0, position=4, done=False)
    membership.connection_lost(0)
    # still within its grace period: it may come back; the wait names who holds the tasks
    assert nxt(s, 2) == {"verdict": "wait", "held_by": [0, 1], "mark": 4 + 10}
    clock.now = 6.0
    membership.expire()
    assert nxt(s, 2)["task"] == [0, 0, 4, 10, 0]    # from its committed position
    membership.leave(1)
    s.on_leave(1)
    assert s.queue.pending[0] == 1


def test_server_0_only_and_stale_epochs_refused():
    s, _, _ = service(server_id=1)
    with pytest.raises(ConfigError, match="server 0 only"):
        register(s)
    s, _, _ = service()
    with pytest.raises(StaleEpoch):
        call(s, "shard_next", trainer=0, **{"pass": 1}, epoch=3)
    with pytest.raises(ConfigError, match="not part of this job"):
        register(s, trainer=7)


def test_sync_next_waits_for_every_report_of_the_step_two_before():
    s, membership, _ = service(trainers=2, mode=Mode.SYNC)
    for t in (0, 1):
        call(s, "shard_register", trainer=t, **{"pass": 1}, fingerprint="f", files=["a"], tasks=TASKS, step=0)
    assert nxt(s, 0, step=0)["verdict"] == "task"
    assert nxt(s, 1, step=0)["verdict"] == "task"
    assert nxt(s, 0, step=1)["verdict"] == "wait"        # reports of step -1: none needed
    call(s, "shard_progress", trainer=0, **{"pass": 1}, step=0, task=0, position=10, done=True)
    waiting = nxt(s, 0, step=2)
    assert isinstance(waiting, Deferred) and not waiting.ready() and waiting.waits_on() == [1]
    call(s, "shard_progress", trainer=1, **{"pass": 1}, step=0, task=1, position=15, done=False)
    assert waiting.ready() and waiting.make_reply().fields["verdict"] == "wait"
    assert waiting.make_reply().fields["held_by"] == [1]


def test_snapshot_waits_for_the_cut_then_restores_elsewhere():
    s, _, _ = service()
    register(s)
    nxt(s, 0)
    call(s, "shard_progress", trainer=0, **{"pass": 1}, step=0, task=0, position=3, done=False)
    pending = call(s, "shard_snapshot", trainer=0, after=[[0, 1]])
    assert isinstance(pending, Deferred) and not pending.ready()
    call(s, "shard_progress", trainer=0, **{"pass": 1}, step=1, task=0, position=6, done=False)
    call(s, "shard_progress", trainer=0, **{"pass": 1}, step=2, task=0, position=9, done=False)
    state = pending.make_reply().fields["state"]
    assert state["position"] == [6, 10]             # step 2 is past the cut
    other, _, _ = service()
    with pytest.raises(ConfigError, match="only the chief"):
        call(other, "shard_restore", trainer=1, state=state)
    assert call(other, "shard_restore", trainer=0, state=state) == {"pass": 1, "pending": 2}
    assert nxt(other, 2)["task"] == [0, 0, 6, 10, 0]
    other.reset()
    assert other.queue.pass_ == 0


def test_every_server_serves_the_ops_and_a_rollback_reset_empties_the_queue():
    from paramshard.server.core.parameter_server import ParameterServer
    server = ParameterServer(0, None, 2, mode="sync", timeout=5.0)
    local = lambda header: server.handle_local(header, []).fields     # noqa: E731
    local({"op": "shard_register", "trainer": 0, "pass": 1, "fingerprint": "f", "files": ["a"], "tasks": TASKS})
    assert local({"op": "shard_next", "trainer": 1, "pass": 1})["verdict"] == "task"
    local({"op": "reset", "epoch": 1, "trainer": 0})
    service = server.service(ShardService)
    assert service.queue.pass_ == 0 and not service.queue.owner
    with pytest.raises(StaleEpoch):
        server.handle_local({"op": "shard_next", "trainer": 1, "pass": 1, "epoch": 0}, [])


def test_an_elastic_snapshot_does_not_wait_for_a_trainer_whose_connection_dropped():
    """Issue 29 (the combination matrix: sync, checkpoints, a trainer killed): the steps up to the
    chief's cut went on without the killed trainer, which will never report them; before, the
    snapshot waited on it and failed as peer_lost, and the chief's checkpoint rolled the job back."""
    s, membership, _ = service(min_trainers=2)
    register(s)
    nxt(s, 0)
    nxt(s, 1)
    call(s, "shard_progress", trainer=1, **{"pass": 1}, step=3, task=1, position=12, done=False)
    membership.connection_lost(1)
    s.on_leave(1)           # what the server does when an elastic job's trainer drops
    call(s, "shard_progress", trainer=0, **{"pass": 1}, step=8, task=0, position=5, done=False)
    state = call(s, "shard_snapshot", trainer=0, after=[[0, 8], [1, 8]])
    assert not isinstance(state, Deferred), state.describe()
    assert 1 in s.queue.pending and state["state"]["position"][1] == 12


def test_a_fixed_job_snapshot_still_waits_for_a_lost_trainer_within_its_grace():
    s, membership, _ = service()
    register(s)
    nxt(s, 1)
    call(s, "shard_progress", trainer=1, **{"pass": 1}, step=3, task=0, position=4, done=False)
    membership.connection_lost(1)
    pending = call(s, "shard_snapshot", trainer=0, after=[[1, 8]])
    assert isinstance(pending, Deferred) and pending.waits_on() == [1]


def test_a_late_report_for_a_task_a_rollback_took_away_is_dropped_not_an_error():
    """Issue 29 leftover: trainer 1 reports task 0 (step 3), a rollback resets the queue and the
    chief restores the checkpoint's (task 0 in the queue, nobody's), then trainer 1's report of task
    0 arrives (a plain ``for batch in loader`` loop went on reading it after the rollback). Before,
    the queue refused it ("reported task 0, which it does not hold"), and the rider's error failed
    the trainer. Now the report is answered ``dropped`` (the trainer drops the task) and changes
    nothing: the restored remainder of task 0 is handed out once, from the checkpoint's position."""
    s, _, _ = service()
    register(s)
    given = nxt(s, 1)
    assert given["task"] == [0, 0, 0, 10, 0]
    lease = given.get("lease")              # what DynamicShards sends back with its reports
    call(s, "shard_progress", trainer=1, **{"pass": 1}, step=3, task=0, position=4, done=False, lease=lease)
    state = s.queue.snapshot({1: 3})
    s.reset()                               # the chief's reset (the rollback) ...
    assert call(s, "shard_restore", trainer=0, state=state)["pending"] == 2    # ... and its restore
    late = call(s, "shard_progress", trainer=1, **{"pass": 1}, step=4, task=0, position=7, done=False,
                lease=lease)
    assert late.get("dropped") == [0]
    assert s.queue.position[0] == 4 and 0 not in s.queue.owner
    # The remainder from the checkpoint's position, once: to whoever asks first.
    again = nxt(s, 2)
    assert again["task"] == [0, 0, 4, 10, 0] and again["lease"] != lease
    assert nxt(s, 1)["task"] == [1, 0, 10, 20, 0]
    # A report of a task a trainer never held in this lease is still refused: a client bug.
    with pytest.raises(ConfigError, match="does not hold"):
        call(s, "shard_progress", trainer=1, **{"pass": 1}, step=5, task=0, position=8, done=False,
             lease=again["lease"])
