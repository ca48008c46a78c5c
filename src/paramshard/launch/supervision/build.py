"""The one way a Launcher is built for a LaunchConfig: ``build_launcher``.

A Launcher (launch/supervision/launcher.py) is a composition, never a subclass: the
placement says where the ranks run (this machine, ``local.LocalPlacement``, or hosts over
ssh, ``ssh.SshHosts``) and makes the engine that starts them; the restart policy is the
job's one budget (the supervisor shares it between runs); the listeners and the run
directory ``paramshard scale`` asks through are handed in here, so nothing is attached to
a Launcher after it exists.
"""
from __future__ import annotations

from pathlib import Path
from typing import TextIO

from paramshard.launch.api import LaunchConfig
from paramshard.launch.engines.placement import Placement, TapFor
from paramshard.launch.supervision.launcher import Launcher
from paramshard.launch.supervision.listeners import JobListeners
from paramshard.launch.supervision.restart_policy import RestartPolicy


def build_launcher(config: LaunchConfig, placement: Placement | None = None, *,
                   policy: RestartPolicy | None = None, out: TextIO | None = None, tap_for: TapFor | None = None,
                   listeners: JobListeners = JobListeners(), control_dir: Path | None = None) -> Launcher:
    """One run of ``config``'s job. ``placement``: where its ranks run (default: this machine);
    ``policy``: the job's restart budget (default: ``config.max_restarts`` for this run alone);
    ``out``: where the ranks' output lines go (default stdout); ``tap_for(rank)``: a tap on each
    rank's lines (the run directory's logs and records); ``listeners``: told of restarts,
    membership changes and events; ``control_dir``: the run directory ``paramshard scale`` asks
    through (None: no control channel)."""
    if placement is None:
        from paramshard.launch.engines.local import LocalPlacement
        placement = LocalPlacement(config)
    return Launcher(placement.engine(out, tap_for), placement,
                    policy=policy if policy is not None else RestartPolicy(config.max_restarts),
                    config=config, listeners=listeners, control_dir=control_dir,
                    min_trainers=config.min_trainers, checkpoint_dir=config.checkpoint_dir)
