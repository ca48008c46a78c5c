"""The job's supervision across runs (launch/supervision/supervisor.py): whole-job restarts from the
latest checkpoint under the budget the in-place restarts share, with fake runs."""
import pytest

from paramshard.launch.supervision.restart_policy import RestartPolicy
from paramshard.launch.supervision.supervisor import Supervisor


class Run:
    """A run of the job that ends with ``code`` after spending ``in_place`` restarts in place."""

    def __init__(self, code, in_place=0, stopped=False):
        # The policy: the job's, as build_launcher is given it (set by _supervise below).
        self.code, self.in_place, self.stopped_by_signal, self.policy = code, in_place, stopped, None

    def start(self):
        return self

    def wait(self):
        self.policy.used += self.in_place
        return self.code


class Listener:
    def __init__(self):
        self.seen = []

    def started(self, launcher):
        self.seen.append(("started", launcher))

    def restarted(self, rank, why):
        self.seen.append(("restarted", (rank, why)))


class _Checkpoint:
    """Only the step the restart's log line names (a real one needs a whole manifest)."""

    def __init__(self, path):
        self.step = int(str(path).rpartition("-")[2])


def _checkpoint(tmp_path, monkeypatch, step=5):
    import paramshard.checkpoint.format as fmt
    monkeypatch.setattr(fmt, "Checkpoint", _Checkpoint)
    (tmp_path / f"step-{step:08d}").mkdir()
    (tmp_path / f"step-{step:08d}" / "manifest.json").write_text("{}")


def _supervise(tmp_path, runs, max_restarts):
    made = []
    policy = RestartPolicy(max_restarts)
    for run in runs:
        run.policy = policy

    def relaunch(left, resume):
        made.append((left, resume))
        return runs[len(made)]
    s = Supervisor(runs[0], relaunch, policy, str(tmp_path), Listener())
    return s, s.run(), made


def test_a_failed_run_runs_again_from_the_latest_checkpoint_with_what_is_left(tmp_path, monkeypatch):
    _checkpoint(tmp_path, monkeypatch)
    s, code, made = _supervise(tmp_path, [Run(1), Run(0)], max_restarts=2)
    assert code == 0 and made == [(1, str((tmp_path / "step-00000005").resolve()))]
    assert s.launcher is not None and s.policy.used == 1
    assert [what for what, _ in s.listener.seen] == ["started", "restarted", "started"]
    rank, why = s.listener.seen[1][1]       # the run directory's event: which, and why
    assert rank == "job" and "exit code 1" in why and "checkpoint step 5" in why


def test_in_place_restarts_of_a_run_use_up_the_budget_of_the_whole_job(tmp_path, monkeypatch):
    _checkpoint(tmp_path, monkeypatch)
    s, code, made = _supervise(tmp_path, [Run(1, in_place=2)], max_restarts=2)
    assert code == 1 and made == []


def test_no_checkpoint_no_restart_and_a_stopped_job_is_not_run_again(tmp_path, monkeypatch):
    s, code, made = _supervise(tmp_path, [Run(3)], max_restarts=2)
    assert code == 3 and made == []
    _checkpoint(tmp_path, monkeypatch)
    s, code, made = _supervise(tmp_path, [Run(130, stopped=True)], max_restarts=2)
    assert code == 130 and made == []


def test_a_run_built_with_another_budget_is_refused_before_it_starts(tmp_path):
    """Every run spends the job's one budget: a Launcher built with its own RestartPolicy would
    restart servers in place beyond --max-restarts."""
    run = Run(0)
    run.policy = RestartPolicy(5)
    with pytest.raises(ValueError, match="the supervisor's RestartPolicy"):
        Supervisor(run, lambda left, resume: run, RestartPolicy(1), str(tmp_path), Listener()).run()
    assert run.policy.used == 0
