"""benchmarks/cpu_budget.py: a process tree's CPU read over a window, and a job's CPU a step."""
import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import cpu_budget  # noqa: E402


@pytest.mark.parametrize("cmdline, role", [
    ("/x/.venv/bin/python -m paramshard server", "servers"),
    ("/x/.venv/bin/python /x/src/paramshard/__main__.py server", "servers"),
    ("/x/python /x/benchmarks/ps_vs_pytorch.py worker --engine ps --data d", "trainers"),
    ("/x/.venv/bin/paramshard launch --servers 2 --trainers 2 /x/ps_vs_pytorch.py worker --engine ps", "launcher"),
    ("/x/.venv/bin/paramshard launch --servers 2 --trainers 2 --mode async", "launcher"),
    ("/usr/bin/python -I -S -c # guardian", "other"),
])
def test_roles_from_command_lines(cmdline, role):
    assert cpu_budget.role_of(cmdline) == role


def test_cpu_at_a_time_is_linear_between_samples_and_flat_outside():
    times, cpus = [10.0, 11.0, 13.0], [1.0, 1.5, 3.5]
    assert cpu_budget._at(times, cpus, 9.0) == 0.0          # before its first sample: not started yet
    assert cpu_budget._at(times, cpus, 10.5) == pytest.approx(1.25)
    assert cpu_budget._at(times, cpus, 12.0) == pytest.approx(2.5)
    assert cpu_budget._at(times, cpus, 20.0) == 3.5          # after its last: it had exited


def burn(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_the_samples_hold_what_the_process_spent():
    """The oracle is the process's own CPU clock: what the samples say it spent between two wall
    times equals what it measured itself, within the kernel's clock tick. (Only this process's
    series: pytest's own children, a fork host among them, may be busy meanwhile.)"""
    tree = cpu_budget.ProcessTreeCPU(os.getpid())
    tree.sample()
    t0, c0 = time.time(), time.process_time()
    burn(0.1)
    tree.sample()
    burn(0.1)
    t1, c1 = time.time(), time.process_time()
    tree.sample()
    times, cpus = tree.series[os.getpid()]
    spent = cpu_budget._at(times, cpus, t1) - cpu_budget._at(times, cpus, t0)
    assert spent == pytest.approx(c1 - c0, abs=4 / cpu_budget.CLOCK_TICKS + 0.02)


def test_a_window_sums_each_role_over_its_processes():
    tree = cpu_budget.ProcessTreeCPU(0)
    tree.series = {1: ([0.0, 10.0], [0.0, 10.0]), 2: ([0.0, 10.0], [0.0, 5.0]), 3: ([0.0, 4.0], [0.0, 4.0])}
    tree.roles = {1: "servers", 2: "servers", 3: "trainers"}
    assert tree.window(2.0, 6.0) == pytest.approx({"servers": 4.0 + 2.0, "trainers": 2.0})


class FakeTree:
    def __init__(self, spent: dict):
        self.spent, self.asked = spent, None

    def window(self, t0, t1):
        self.asked = (t0, t1)
        return self.spent


def test_budget_is_per_step_over_the_window_every_trainer_was_timing():
    tree = FakeTree({"trainers": 1.2, "servers": 0.4, "launcher": 0.0})
    trainers = [{"window": [100.0, 110.0], "steps_timed": 100},     # 10 steps/s
                {"window": [102.0, 112.0], "steps_timed": 50}]      # 5 steps/s
    out = cpu_budget.budget(tree, trainers)
    assert tree.asked == (102.0, 110.0)
    steps = 100 * 8 / 10 + 50 * 8 / 10                              # 120 steps in the common 8 s
    assert out["trainers"] == pytest.approx(1.2 / steps * 1e3)
    assert out["total"] == pytest.approx(1.6 / steps * 1e3)
    assert out["cores_busy"] == pytest.approx(1.6 / 8)


def test_no_budget_without_a_common_window():
    trainers = [{"window": [100.0, 101.0], "steps_timed": 10}, {"window": [102.0, 103.0], "steps_timed": 10}]
    assert cpu_budget.budget(FakeTree({}), trainers) is None
    assert cpu_budget.budget(FakeTree({}), [{"steps_timed": 10}]) is None
