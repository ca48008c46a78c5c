"""server/core/waiting.py: the one list of deferred answers (socket and in-process paths), with an
injected clock: answered when ready, failed at once on a lost trainer, timed out at the deadline."""
import math

from paramshard.server.core.replies import Deferred, Reply
from paramshard.server.core.waiting import WaitingList
from paramshard.server.core.barrier import Membership

from tests.unit.server_fakes import Clock, Recorded


def setup(trainers=2):
    clock = Clock()
    membership = Membership(trainers, grace=5.0, clock=clock)
    return clock, membership, WaitingList("server 0", membership, timeout=5.0, clock=clock)


def deferred(flag, waits_on=(1,)):
    return Deferred(ready=lambda: flag["ready"], make_reply=lambda: Reply({"x": 1}),
                    describe=lambda: "step 3 is not complete", waits_on=lambda: list(waits_on))


def test_a_ready_wait_is_answered_once_with_its_queue_time_counted():
    clock, _, waiting = setup()
    flag, answer = {"ready": False}, Recorded()
    waiting.add(answer, "pull_dense", deferred(flag))
    waiting.answer_ready()
    assert answer.replies == [] and len(waiting) == 1
    clock.now += 1.5
    flag["ready"] = True
    waiting.answer_ready()
    waiting.answer_ready()
    assert [r.fields for r in answer.replies] == [{"x": 1}] and len(waiting) == 0
    assert waiting.stats["deferred_answered"] == 1 and waiting.stats["deferred_wait_s"] == 1.5


def test_a_wait_on_a_lost_trainer_fails_at_once_naming_it():
    _, membership, waiting = setup()
    answer = Recorded()
    waiting.add(answer, "pull_dense", deferred({"ready": False}, waits_on=(1,)))
    membership.connection_lost(1)
    waiting.answer_ready()
    (code, message), = answer.errors
    assert code == "peer_lost" and "trainers [1] lost their connection" in message
    assert "step 3 is not complete" in message and len(waiting) == 0


def test_the_deadline_gives_a_timeout_error_and_inf_never_expires():
    clock, _, waiting = setup()
    socket_like, in_process = Recorded(), Recorded()
    waiting.add(socket_like, "barrier", deferred({"ready": False}))
    waiting.add(in_process, "barrier", deferred({"ready": False}), timeout=math.inf)
    assert waiting.soonest_deadline() == clock.now + 5.0
    clock.now += 4.9
    waiting.answer_ready()
    assert socket_like.errors == []
    clock.now += 0.2
    waiting.answer_ready()
    assert socket_like.errors == [("timeout", "server 0 gave up on barrier after 5 s: step 3 is not complete")]
    assert in_process.errors == [] and len(waiting) == 1 and waiting.stats["timeouts"] == 1


def test_a_failing_reply_becomes_a_failure_and_the_others_go_on():
    _, _, waiting = setup()
    broken, fine = Recorded(), Recorded()
    waiting.add(broken, "pull_sparse", Deferred(ready=lambda: True, make_reply=lambda: 1 / 0,
                                                describe=lambda: "", waits_on=None))
    waiting.add(fine, "pull_sparse", deferred({"ready": True}))
    waiting.answer_ready()
    assert [op for op, _ in broken.failures] == ["pull_sparse"]
    assert isinstance(broken.failures[0][1], ZeroDivisionError) and len(fine.replies) == 1


def test_fail_all_voids_every_wait_and_remove_where_forgets_some():
    _, _, waiting = setup()
    a, b, c = Recorded(), Recorded(), Recorded()
    for answer in (a, b, c):
        waiting.add(answer, "push_dense", deferred({"ready": False}))
    gone = waiting.remove_where(lambda w: w.answer is b)
    assert [w.answer for w in gone] == [b] and len(waiting) == 2
    waiting.fail_all("reset", "server 0: the job rolls back")
    assert a.errors == c.errors == [("reset", "server 0: the job rolls back; this push_dense is void")]
    assert b.errors == [] and len(waiting) == 0
