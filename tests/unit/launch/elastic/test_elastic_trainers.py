"""launch/elastic/elastic_trainers.py over the launcher's loop with fake processes (the Process protocol
and nothing more, as tests/unit/launch/supervision/test_launcher_loop.py): no real process, no sleep."""
import signal

import pytest

from paramshard.errors import ConfigError
from paramshard.launch.elastic.elastic_trainers import ElasticTrainers
from paramshard.launch.supervision.launcher import Launcher
from paramshard.launch.supervision.listeners import JobListeners
from paramshard.launch.supervision.restart_policy import RestartPolicy

from tests.unit.launch.elastic.fake_job import FakeJob
from tests.unit.launch.supervision.test_launcher_loop import Engine, Rank, _spec


class Elastic(Engine):
    """Records what it starts (with the rank's env) and whom it asks to leave."""
    def __init__(self, plan=None):
        super().__init__(plan or {})
        self.started, self.asked = [], []

    def start(self, rank):
        p = Rank(rank.name, *self.plan.get(rank.name, (None, ())))
        self.started.append((rank.name, rank.env.joining))
        return p

    def ask_to_leave(self, p):
        self.asked.append(p.tag)


def launched(minimum=2, trainers=3, restarts=0, engine=None):
    heard = []
    listeners = JobListeners(membership=(lambda change, text, **f: heard.append((change, f["trainer"], f["live"])),))
    engine = engine or Elastic()
    launcher = Launcher(engine, policy=RestartPolicy(restarts), min_trainers=minimum, listeners=listeners)
    launcher.start_job(_spec(servers=1, trainers=trainers))
    return launcher, engine, heard


def test_a_dead_trainer_is_replaced_alone_in_its_slot_and_joins():
    launcher, engine, heard = launched(restarts=1)
    launcher.trainers[1].code = -signal.SIGKILL
    dead = launcher.trainers[1]
    assert launcher.elastic.tolerated([dead]) == [dead]
    assert launcher.trainers[1] is not dead and launcher.trainers[1].poll() is None
    assert engine.started[-1] == ("trainer 1", True) and launcher.policy.left == 0
    assert heard == [("replaced", 1, 3)]
    launcher.trainers[2].code = 1                 # no budget left: 2 alive, MIN 2, goes on
    assert launcher.elastic.tolerated([launcher.trainers[2]]) == [launcher.trainers[2]]
    assert heard[-1] == ("lost", 2, 2)
    launcher.trainers[0].code = 1                 # 1 alive < MIN: the failure stands
    assert launcher.elastic.tolerated([launcher.trainers[0]]) == []


def test_the_loop_finishes_when_the_others_succeed_without_the_lost_one():
    engine = Elastic({"trainer 0": (0, ()), "trainer 1": (0, ()), "trainer 2": (3, ()), "server 0": (0, ())})
    launcher, _, heard = launched(engine=engine)
    assert launcher.wait(poll_interval=0) == 0 and heard == [("lost", 2, 0)]


def test_scale_down_asks_the_highest_to_leave_and_their_exit_is_no_failure():
    launcher, engine, heard = launched()
    assert launcher.elastic.scale(2) == "asked trainers [2] to leave at their next step boundary: 2 trainers"
    assert engine.asked == ["trainer 2"]
    launcher.trainers[2].code = -signal.SIGUSR1      # left before its Trainer took the signal: still a leave
    assert launcher.elastic.tolerated([launcher.trainers[2]]) == [launcher.trainers[2]]
    assert heard == [("scale", None, 3), ("asked to leave", 2, 3), ("left", 2, 2)]
    assert launcher.elastic.scale(3) == "starting trainers [2]: 3 trainers"
    assert engine.started[-1] == ("trainer 2", True) and launcher.trainers[2].poll() is None
    assert heard[-2:] == [("scale", None, 2), ("joined", 2, 3)]
    assert launcher.elastic.scale(3) == "already 3 trainers"


def test_scale_refusals_say_what_to_do():
    launcher, engine, _ = launched(minimum=2, trainers=3)
    with pytest.raises(ConfigError, match="runs 2 to 3 trainers"):
        launcher.elastic.scale(1)
    launcher.elastic.scale(2)
    with pytest.raises(ConfigError, match="still leaving; ask again once they left"):
        launcher.elastic.scale(3)
    plain = Launcher(Elastic())
    plain.start_job(_spec(servers=1, trainers=2))
    with pytest.raises(ConfigError, match="not elastic; launch it with --trainers MIN:MAX"):
        plain._scale_trainers(3)       # what `paramshard scale --trainers 3` asks (the control channel)


def test_through_the_job_control_port_alone_a_dead_trainer_is_replaced_and_a_scale_down_asks_by_slot():
    """ElasticTrainers driven by a fake JobControl (fake_job.py): it starts a joining rank in the dead
    one's slot, spends the job's budget, asks the highest slot to leave, and tells every change."""
    job = FakeJob(servers=1, trainers=3, restarts=1)
    elastic = ElasticTrainers(job, minimum=2)
    dead = job.trainers[1]
    dead.code = 1
    assert elastic.tolerated([dead]) == [dead]
    (rank,) = job.started
    assert rank.name == "trainer 1" and rank.env.joining and job.trainers[1] is not dead
    assert job.policy.used == 1
    assert elastic.scale(2) == "asked trainers [2] to leave at their next step boundary: 2 trainers"
    assert job.asked == [2]
    job.trainers[2].code = 0                       # it left
    assert elastic.tolerated([]) == [] and elastic.staying() == [0, 1]
    assert [(a[0], f["trainer"], f["live"]) for a, f in job.told] == [
        ("replaced", 1, 3), ("scale", None, 3), ("asked to leave", 2, 3), ("left", 2, 2)]
