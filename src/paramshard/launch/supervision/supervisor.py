"""The job from start to end: runs of it, each watched by a Launcher, under one restart budget.

A run's Launcher restarts servers in place; when a run fails anyway, the restart
policy (launch/supervision/restart_policy.py) decides whether the job runs again from the
latest checkpoint. Both draw on the same ``RestartPolicy``, so ``--max-restarts N``
means N restarts of either kind in all: every run's Launcher is built with the
supervisor's (launch/supervision/build.py). ``paramshard launch`` (cli/jobs/launch.py) only
parses its flags, builds the first run's Launcher and hands it here.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol

from paramshard.log import get_logger
from paramshard.launch.supervision.launcher import Launcher
from paramshard.launch.supervision.restart_policy import Choice, RestartPolicy
from paramshard.launch.supervision.signals import StopSignal, signal_number, stop_signals

log = get_logger("launch")


class RunListener(Protocol):
    """Sees each run of the job (observe/live/job_watch.py: the run directory, the live table);
    what a run tells while it runs goes to the listeners it was built with."""

    def started(self, launcher: Launcher) -> None:
        """Every rank of the run was started."""

    def restarted(self, rank: str, why: str) -> None:
        """``rank`` ("server 1"; "job": every rank) is started again, for ``why``."""


# (restarts left, checkpoint to resume from) -> the Launcher of the job's next run.
Relaunch = Callable[[int, str], Launcher]


class Supervisor:
    def __init__(self, first: Launcher, relaunch: Relaunch, policy: RestartPolicy,
                 checkpoint_dir: str | None, listener: RunListener):
        """``policy``: the job's restart budget, the one every run's Launcher was built with."""
        self.policy = policy
        self.relaunch, self.checkpoint_dir, self.listener = relaunch, checkpoint_dir, listener
        self.launcher = first        # the current run's (the listener reads the last one at the end)
        self.code = 1

    def _latest(self) -> Path | None:
        from paramshard.checkpoint.format import checkpoints
        done = checkpoints(self.checkpoint_dir) if self.checkpoint_dir else []
        return done[-1] if done else None

    def run(self) -> int:
        """Run the job until it succeeds, is stopped, or the policy gives up; its exit status."""
        while True:
            if self.launcher.policy is not self.policy:
                raise ValueError("a run's Launcher must be built with the supervisor's RestartPolicy "
                                 "(build_launcher(policy=...)): in-place restarts spend the job's budget")
            self.code, stopped = self._run_once(self.launcher)
            decision = self.policy.whole_job(self.code, stopped, self._latest)
            if decision.choice is Choice.NO_CHECKPOINT:
                log.error("no checkpoint in %s yet: nothing to restart from", self.checkpoint_dir)
            if not decision.restart:
                return self.code
            self.policy.spend(decision)
            assert decision.checkpoint is not None, "a whole-job restart is to a checkpoint (RestartPolicy)"
            from paramshard.checkpoint.format import Checkpoint
            why = (f"the run failed with exit code {self.code}: restart {self.policy.used} of "
                   f"{self.policy.max_restarts}: every server and trainer starts again from checkpoint step "
                   f"{Checkpoint(decision.checkpoint).step} ({decision.checkpoint}); the steps after it are "
                   "trained again")
            log.warning("%s", why)
            self.listener.restarted("job", why)
            self.launcher = self.relaunch(self.policy.left, str(decision.checkpoint.resolve()))

    def _run_once(self, launcher: Launcher) -> tuple[int, bool]:
        """(exit status, stopped by a signal)."""
        # SIGTERM (timeout, Slurm, Kubernetes, systemd) and SIGHUP stop the job as Ctrl-C does.
        with stop_signals():
            try:
                launcher.start()
                self.listener.started(launcher)
                code = launcher.wait()
                return code, launcher.stopped_by_signal
            except (KeyboardInterrupt, StopSignal) as exc:     # before wait() took over, or after it
                return launcher.stop_on_signal(signal_number(exc)), True
