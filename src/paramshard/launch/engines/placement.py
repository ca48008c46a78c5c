"""Where a job's ranks run: the ``Placement`` a Launcher is built with.

A placement turns a ``LaunchConfig`` into a ``JobSpec`` once, before anything starts (free ports
on this machine; over SSH: every host probed, the workspace copied, threads counted per
machine), makes the ``Engine`` that starts ranks there, and places the ranks a running job
starts later (a joining trainer, a server a scale adds). ``local.LocalPlacement`` runs every
rank on this machine; ``ssh.SshHosts`` over ssh on the job's hosts, which ``scale --add-host``
and ``--remove-host`` change while it runs (``on_hosts``). The Launcher
(launch/supervision/launcher.py) asks it and never knows which one it has.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol, TextIO

if TYPE_CHECKING:
    from paramshard.launch.api import JobSpec, LaunchConfig, RankSpec
    from paramshard.launch.engines.hosts import Host
    from paramshard.launch.engines.process import Engine

# rank -> a tap on its output lines (observe/run_records/run_dir.py: logs and records); None: print them all.
TapFor = Callable[["RankSpec"], Callable[[str], bool]]


class Placement(Protocol):
    # The ranks may run on several hosts, which change while the job runs: `scale --add-host`,
    # `--servers N --on HOST` and `--remove-host` apply (SSH). False: every rank runs here.
    on_hosts: bool
    config: "LaunchConfig"       # the job it places


    def engine(self, out: TextIO | None, tap_for: TapFor | None) -> "Engine":
        """The engine that starts this placement's ranks; their output lines go to ``out``."""

    def job_spec(self, running: Callable[[], "list[RankSpec]"],
                 record: Callable[..., None]) -> "JobSpec":
        """Every rank with its host and address, before any starts (raise ConfigError naming the
        host at fault). ``running``: the ranks running at the time it is called (mid-job placement
        counts them); ``record(event, text, **fields)``: the run directory's event log."""

    def describe(self, spec: "JobSpec") -> str:
        """The log line once every rank of ``spec`` started."""

    def new_server_address(self, host: str | None = None) -> str:
        """host:port for a server started mid-job (``host``: a host named by ``--on``)."""

    def place_rank(self, rank: "RankSpec") -> "RankSpec":
        """``rank``, about to start mid-job, on its host (this machine: as it is)."""

    def add_host(self, text: str) -> str:
        """``scale --add-host``: make ``text`` one of the job's hosts (``on_hosts`` only)."""

    def find(self, text: str) -> "Host":
        """The job's host ``text`` names (``on_hosts`` only); ConfigError if none."""

    def remove_host(self, host: "Host") -> None:
        """No rank started from now on goes to ``host`` (``on_hosts`` only)."""
