"""server/elastic/shard_queue.py: tasks handed out, reported, given back on leave or loss;
over random join/leave/kill schedules every record is trained exactly once per pass
(the count check); sync verdicts agree per step; snapshots roll back to a cut."""
import random

import pytest
from hypothesis import given, settings, strategies as st

from paramshard.data.shards.tasks import MAX_TASKS
from paramshard.errors import ConfigError, LimitExceeded
from paramshard.server.elastic.shard_queue import FINISHED, TASK, WAIT, ShardQueue

FILES = ["a", "b"]


def task_list(sizes):
    """Tasks whose positions count records: task i holds records [start, end)."""
    tasks, start = [], 0
    for n in sizes:
        tasks.append([0, start, start + n, 0])
        start += n
    return tasks


def registered(sizes, trainers=8):
    q = ShardQueue(trainers)
    assert q.register(1, "f", FILES, task_list(sizes)) == "registered"
    return q


class Sim:
    """Trainers reading records step by step; a report commits what a step trained."""

    def __init__(self, q, rng):
        self.q, self.rng = q, rng
        self.step = {}        # trainer -> next step
        self.held = {}        # trainer -> [id, file, position, end, kind]
        self.trained = []     # records whose step was reported

    def act(self, trainer):
        q = self.q
        if trainer not in self.held:
            verdict, task = q.next(trainer, 1)
            if verdict != TASK:
                return verdict
            self.held[trainer] = task
        task_id, _, pos, end, _ = self.held[trainer]
        n = min(self.rng.randint(1, 3), end - pos)
        step = self.step.get(trainer, 0)
        q.progress(trainer, 1, step, task_id, pos + n, pos + n == end)
        self.trained += range(pos, pos + n)
        self.step[trainer] = step + 1
        if pos + n == end:
            del self.held[trainer]
        else:
            self.held[trainer][2] = pos + n
        return TASK

    def kill(self, trainer):
        """Died between steps (or mid-step: that step's records were never pushed nor reported)."""
        self.held.pop(trainer, None)
        self.q.release(trainer)


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 9), min_size=1, max_size=12), seed=st.integers(0, 2**32 - 1),
       kill_rate=st.floats(0, 0.3))
def test_every_record_trained_exactly_once_whatever_joins_or_leaves(sizes, seed, kill_rate):
    rng = random.Random(seed)
    q = registered(sizes, trainers=64)
    sim = Sim(q, rng)
    live, next_slot = {0, 1, 2}, 3
    for _ in range(10_000):
        if q.finished:
            break
        r = rng.random()
        if r < kill_rate and len(live) > 1:
            victim = rng.choice(sorted(live))
            live.discard(victim)
            sim.kill(victim)
        elif r < 2 * kill_rate and next_slot < 64:
            live.add(next_slot)
            next_slot += 1
        else:
            sim.act(rng.choice(sorted(live)))
    assert q.finished
    assert sorted(sim.trained) == list(range(sum(sizes)))
    for t in live:
        assert q.next(t, 1) == (FINISHED, None)


def test_a_released_remainder_goes_first_from_the_committed_position():
    q = registered([10, 10])
    assert q.next(0, 1) == (TASK, [0, 0, 0, 10, 0])
    q.progress(0, 1, 0, 0, 4, False)
    assert q.next(1, 1) == (TASK, [1, 0, 10, 20, 0])
    assert q.next(2, 1) == (WAIT, None)                  # tasks in progress elsewhere may come back
    assert q.release(0) == [0]
    assert q.next(2, 1) == (TASK, [0, 0, 4, 10, 0])
    with pytest.raises(ConfigError, match="does not hold"):
        q.progress(0, 1, 1, 0, 6, False)
    with pytest.raises(ConfigError, match="before the committed"):
        q.progress(2, 1, 0, 0, 3, False)
    with pytest.raises(ConfigError, match="reported step 0 already"):
        q.progress(0, 1, -1, -1, 0, False)


def test_a_trainer_holds_a_few_tasks_and_gives_all_back():
    q = registered([1] * 10)
    assert [q.next(0, 1)[1][0] for _ in range(4)] == [0, 1, 2, 3]
    with pytest.raises(LimitExceeded, match="holds 4 data tasks"):
        q.next(0, 1)
    q.progress(0, 1, 0, 1, 2, True)
    assert q.next(0, 1)[1][0] == 4
    assert q.release(0) == [0, 2, 3, 4]
    assert list(q.pending)[:5] == [0, 2, 3, 4, 5]


def test_registration_repeat_accepted_different_refused_next_pass_after_finish():
    q = registered([2])
    assert q.register(1, "f", FILES, task_list([2])) == "same"
    with pytest.raises(ConfigError, match="different task list"):
        q.register(1, "g", FILES, task_list([3]))
    with pytest.raises(ConfigError, match="still has 1 tasks"):
        q.register(2, "g", FILES, task_list([3]))
    assert q.next(5, 2) == (WAIT, None)                  # pass 2 not registered yet
    q.next(0, 1)
    q.progress(0, 1, 0, 0, 2, True)
    assert q.register(2, "g", FILES, task_list([3])) == "registered"
    assert q.next(3, 1) == (FINISHED, None)              # a late trainer skips the pass it missed
    assert q.register(1, "f", FILES, task_list([2])) == "past"


@pytest.mark.parametrize("files,tasks,error", [
    (["a"] * 100_001, [], LimitExceeded), (["a"], [[0, 0, 1, 0]] * (MAX_TASKS + 1), LimitExceeded),
    (["a"], [[1, 0, 1, 0]], ConfigError), (["a"], [[0, 0, 1, 9]], ConfigError), (["a"], [[0, 0, 1]], ConfigError),
    ([""], [], LimitExceeded)])
def test_hostile_task_lists_are_refused_before_anything_is_kept(files, tasks, error):
    q = ShardQueue(2)
    with pytest.raises(error):
        q.register(1, "f", files, tasks)
    assert q.pass_ == 0 and q.tasks == []


def test_sync_verdicts_agree_at_each_step():
    """Trainer 0 finishes the last task at step 3; trainer 1 is idle from step 2 on. The verdict
    for step j is decided by the reports of steps <= j - 2: both are told the pass is over for
    step 5 (a prefetching trainer asks for step 5's data while step 4 trains), not before."""
    q = registered([4, 2])
    q.register(1, "f", FILES, task_list([4, 2]), trainer=0, step=0)
    q.register(1, "f", FILES, task_list([4, 2]), trainer=1, step=0)
    assert q.reports_missing(-1, {0, 1}) == []
    assert q.next(0, 1, 0)[0] == TASK and q.next(1, 1, 0)[0] == TASK
    for step, position in enumerate([1, 2]):
        q.progress(0, 1, step, 0, position, False)
        q.progress(1, 1, step, 1, 4 + position, step == 1)
    assert q.next(1, 1, 2) == (WAIT, None)
    q.progress(0, 1, 2, 0, 3, False)
    q.progress(1, 1, 2, -1, 0, False)                    # an empty step, reported
    q.progress(0, 1, 3, 0, 4, True)                      # the last task done by step 3's report
    assert q.reports_missing(3, {0, 1}) == [1]
    assert q.next(1, 1, 4) == (WAIT, None)               # step 4: decided by reports up to step 2
    q.progress(1, 1, 3, -1, 0, False)
    assert q.reports_missing(3, {0, 1}) == []
    assert q.next(0, 1, 5) == q.next(1, 1, 5) == (FINISHED, None)
    assert q.reports_missing(4, {0, 1}) == [0, 1]


def test_snapshot_leaves_out_reports_past_the_cut_and_restore_requeues_in_progress():
    q = registered([5, 5, 5])
    q.next(0, 1)
    q.next(1, 1)
    q.progress(0, 1, 0, 0, 2, False)
    q.progress(1, 1, 0, 1, 10, True)                      # task 1 done at step 0
    q.progress(0, 1, 1, 0, 4, False)
    q.progress(0, 1, 2, 0, 5, True)
    state = q.snapshot({0: 1, 1: 0})                      # trainer 0's step 2 is past the cut
    assert state["position"] == [4, 10, 10] and state["done"] == [1]
    assert q.snapshot()["done"] == [0, 1]
    other = ShardQueue(4)
    other.restore(state)
    assert other.next(3, 1) == (TASK, [0, 0, 4, 5, 0])    # in progress at the cut: back in the queue
    assert other.next(2, 1) == (TASK, [2, 0, 10, 15, 0])
    assert other.next(1, 1) == (WAIT, None)
    for bad in ({}, {**state, "position": [1]}, {**state, "done": [7]}, {**state, "pass": -1}):
        with pytest.raises(ConfigError):
            ShardQueue(2).restore(bad)


def test_a_replacement_process_in_the_same_slot_takes_over_from_the_dead_one():
    q = registered([5, 5])
    q.register(1, "f", FILES, task_list([5, 5]), trainer=0, step=0, session="old")
    q.next(0, 1)
    q.progress(0, 1, 30, 0, 2, False)
    q.register(1, "f", FILES, task_list([5, 5]), trainer=0, step=30, session="old")    # the same process
    assert q.holding[0] == [0]
    q.register(1, "f", FILES, task_list([5, 5]), trainer=0, step=4, session="new")     # resumed elsewhere
    assert q.holding.get(0, []) == [] and list(q.pending) == [0, 1] and q.reported[0] == 3
    assert q.next(0, 1) == (TASK, [0, 0, 2, 5, 0])
    q.progress(0, 1, 4, 0, 3, False)                                                 # its own steps count
    with pytest.raises(ConfigError, match="at most 64"):
        q.register(1, "f", FILES, task_list([5, 5]), trainer=1, session="x" * 65)


def test_a_cut_before_the_report_that_finished_the_pass_gives_that_pass_back():
    """Async: trainer 1's step 7 finished pass 1 but was held at the cut (cut[1] = 6); trainer 0
    already took pass 2's first task. The checkpoint must hold pass 1 with task 1 not done."""
    q = registered([3, 3])
    q.next(0, 1)
    q.next(1, 1)
    q.progress(0, 1, 4, 0, 3, True)
    q.progress(1, 1, 6, 1, 4, False)
    q.progress(1, 1, 7, 1, 6, True)
    assert q.register(2, "g", FILES, task_list([5])) == "registered"
    q.next(0, 2)
    q.progress(0, 2, 5, 0, 2, False)
    state = q.snapshot({0: 4, 1: 6})
    assert (state["pass"], state["fingerprint"], state["position"], state["done"]) == (1, "f", [3, 4], [0])
    state = q.snapshot({0: 4, 1: 7})                     # pass 1 whole at the cut: pass 2 from its start
    assert (state["pass"], state["position"], state["done"]) == (2, [0], [])


def test_a_trainer_that_left_is_not_waited_for_until_it_registers_again():
    """An elastic app job (tests/e2e/test_ctr_app.py, sync): trainer 2 left at step ~200 and
    another process joined in its slot at step 438; the other trainers' task for step 438 waited
    for 'the shard reports of step 436 of trainers [2]' (the leaver's last report was 200) before
    the joiner could register, while the joiner's first pull waited for their push: deadlock."""
    q = registered([50] * 4, trainers=3)
    for t in range(3):
        q.register(1, "f", FILES, task_list([50] * 4), trainer=t, step=0, session=f"p{t}")
    q.next(2, 1)
    q.progress(2, 1, 200, 0, 7, False)
    assert q.reports_missing(436, {0, 1, 2}) == [0, 1, 2]
    q.release(2)                                    # it left: its task goes back
    assert q.reports_missing(436, {0, 1, 2}) == [0, 1], "a trainer that left is not waited for"
    q.register(1, "f", FILES, task_list([50] * 4), trainer=2, step=438, session="joiner")
    assert q.reports_missing(436, {0, 1, 2}) == [0, 1] and q.reports_missing(438, {2}) == [2]
