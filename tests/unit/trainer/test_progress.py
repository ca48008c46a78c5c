"""trainer/progress.py: TrainerProgress, the one owner of where a trainer is (step, data position,
state, barrier counts, the last saved step), and what a resume and a rollback put back."""
import random

import pytest

from paramshard.client.recovery import RecoveryPolicy
from paramshard.errors import ConfigError, ServerUnavailable
from paramshard.trainer.position import capture
from paramshard.trainer.progress import TrainerProgress


def progress(max_restarts=0, trainer_id=1) -> TrainerProgress:
    return TrainerProgress(trainer_id, RecoveryPolicy(max_restarts, "/ckpt" if max_restarts else None))


class Checkpoint:
    """What a resume reads of a checkpoint: its step and each trainer's saved position."""

    def __init__(self, step, positions):
        self.step, self.positions = step, positions

    def trainer_position(self, trainer_id):
        return self.positions.get(trainer_id)


def test_a_barrier_counts_once_it_passed_and_a_failed_wait_is_tried_again_with_the_same_count():
    p = progress()
    seen = []
    assert p.meet("eval", lambda count, resumed: seen.append((count, resumed)) or "out") == "out"

    def fails(count, resumed):
        seen.append((count, resumed))
        raise ServerUnavailable("server 0 is gone")
    with pytest.raises(ServerUnavailable):
        p.meet("eval", fails)
    p.meet("eval", lambda count, resumed: seen.append((count, resumed)))
    p.meet("other", lambda count, resumed: seen.append((count, resumed)))
    assert seen == [(1, False), (2, False), (2, False), (1, False)]
    assert p.barrier_counts() == {"eval": 2, "other": 1}
    p.barrier_counts()["eval"] = 99          # a copy: nobody outside changes the counts
    assert p.barrier_counts() == {"eval": 2, "other": 1}


def test_a_resume_puts_step_state_loop_and_barrier_counts_back_and_marks_the_counts_resumed():
    saved = progress(trainer_id=1)
    saved.step = 7
    saved.meet("epoch-end", lambda c, r: None)
    saved.begin_epoch(2)
    for _ in range(3):
        saved.advance()
    saved.meet("eval", lambda c, r: None)      # after the epoch began: not in the loop's counts
    random.seed(5)
    position = capture(saved.step, {"best": 0.5})
    position["loop"] = saved.loop_json()
    after_save = random.random()

    p = progress(trainer_id=1)
    p.resume(Checkpoint(10, {1: position}))
    assert (p.step, p.state, p.loop.epoch, p.loop.start_step) == (10, {"best": 0.5}, 2, 7)
    assert p.barrier_counts() == {"epoch-end": 1, "eval": 1}     # the counts at the checkpoint
    assert not p.unsaved                               # the checkpoint is this step's
    assert random.random() == after_save               # the random streams as saved
    resumed = []
    p.meet("epoch-end", lambda count, r: resumed.append((count, r)))
    p.meet("epoch-end", lambda count, r: resumed.append((count, r)))
    assert resumed == [(2, True), (3, False)]          # resumed until passed once


def test_without_a_checkpoint_here_the_servers_step_is_taken_and_the_position_starts_afresh():
    p = progress()
    p.resume(None, servers_step=12)
    assert (p.step, p.position, p.state, p.barrier_counts()) == (12, {}, {}, {})
    q = progress()
    q.step = 4
    q.resume(None, servers_step=None)       # versions do not count steps: the step stays
    assert q.step == 4


def test_steps_and_the_saved_step():
    p = progress()
    assert p.unsaved            # nothing saved yet
    p.saved()
    assert not p.unsaved
    p.advance()
    assert p.step == 1 and p.unsaved


def test_a_joiner_goes_on_at_the_jobs_step_and_counts():
    p = progress()
    counts = {"epoch-end": 3}
    p.joined_at(40, counts)
    counts["epoch-end"] = 9
    assert (p.step, p.barrier_counts()) == (40, {"epoch-end": 3})
    assert p.meet("epoch-end", lambda count, resumed: (count, resumed)) == (4, False)


def rolled_back_progress(step_at_checkpoint=5):
    """A progress 3 steps past a checkpoint in epoch 1, with a restore that goes back to it."""
    p = progress(max_restarts=2)
    p.begin_epoch(1)
    restored = []

    def restore():
        restored.append(p.step)
        return Checkpoint(step_at_checkpoint, {}), None
    p.restore_with(restore)
    p.step = step_at_checkpoint + 3
    return p, restored


def test_a_rollback_the_policy_admits_goes_back_to_the_checkpoint_and_replays_the_loop():
    p, restored = rolled_back_progress()
    p.roll_back(ServerUnavailable("server 1 is gone"))
    assert restored == [8] and p.step == 5 and p.recoveries == 1
    assert p.replay_pending          # in a batch loop: barriers are void until it replays
    assert not p.take_void_step()    # a failed step() is not a void one: it simply did not count
    assert p.replay_plan(8) == ("3 steps are trained again: the batch loop goes on from epoch 1, batch 5 "
                                "(trainer.prefetching replays them)")
    p.replay_starts()
    assert not p.replay_pending


def test_a_rollback_in_a_forward_makes_its_step_void_once():
    p, _ = rolled_back_progress()
    p.roll_back_in_forward(ServerUnavailable("server 1 is gone"))
    assert p.take_void_step() and not p.take_void_step()


def test_a_rollback_outside_the_loop_voids_the_calls_until_the_loop_replays():
    p = progress(max_restarts=1)
    p.restore_with(lambda: (Checkpoint(0, {}), None))
    assert not p.loop.active
    p.roll_back_outside_loop(ServerUnavailable("server 0 is gone"))
    assert p.replay_pending


def test_an_error_the_policy_does_not_admit_is_raised_and_nothing_is_restored():
    p, restored = rolled_back_progress()
    with pytest.raises(ConfigError):
        p.roll_back(ConfigError("not a server's failure"))
    off = progress(max_restarts=0)
    off.restore_with(lambda: pytest.fail("restored with recovery off"))
    with pytest.raises(ServerUnavailable):
        off.roll_back(ServerUnavailable("server 0 is gone"))
    p.roll_back(ServerUnavailable("server 0 is gone"))
    p.roll_back(ServerUnavailable("server 0 is gone"))
    with pytest.raises(ServerUnavailable):      # spent: max_restarts=2
        p.roll_back(ServerUnavailable("server 0 is gone"))
    assert len(restored) == 2 and p.recoveries == 2


def test_a_rollback_before_the_trainer_started_is_the_error_itself():
    p = progress(max_restarts=1)
    with pytest.raises(ServerUnavailable):
        p.roll_back(ServerUnavailable("server 0 is gone"))
    assert p.recoveries == 0


def test_the_loop_reads_the_step_and_counts_of_the_progress():
    p = progress()
    p.meet("a", lambda c, r: None)
    p.step = 3
    batches = list(p.batches(range(5)))
    assert batches == [0, 1, 2, 3, 4] and p.loop.start_step == 3 and p.loop.barrier_counts == {"a": 1}
    p.step = 5
    assert p.loop_json() == {"epoch": None, "batch": 2, "loader_pass": None, "barrier_counts": {"a": 1}}
