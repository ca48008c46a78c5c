"""What an elastic controller may do to the running job: the ``JobControl`` port.

The controllers of launch/elastic/ (elastic_trainers.py, elastic_servers.py; the replica keeper
is given only ``record``) change a job while the Launcher's loop watches it. They see it through
this Protocol and nothing more: its ranks, where a new server may listen, starting a rank,
asking a trainer to leave, the job's restart budget, its end, and the run directory's event
log. ``Launcher`` (launch/supervision/launcher.py) implements it; the unit tests drive the
controllers with a fake one (tests/unit/launch/elastic/fake_job.py). Every member is always
there: a capability a job may lack (starting a server mid-job) is a declared answer
(``starts_servers``), never an attribute looked for.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:
    from paramshard.launch.api import JobSpec, RankSpec
    from paramshard.launch.engines.process import Process
    from paramshard.launch.supervision.restart_policy import RestartPolicy


@runtime_checkable
class JobControl(Protocol):
    @property
    def spec(self) -> "JobSpec":
        """The job as it started: the model of every rank started later."""

    @property
    def servers(self) -> "Sequence[Process]":
        """Every server the job had, by index (one a scale removed included: it may still run)."""

    @property
    def trainers(self) -> "Sequence[Process]":
        """The trainer in each slot 0..MAX-1 (the latest process started there)."""

    @property
    def policy(self) -> "RestartPolicy":
        """The job's one restart budget (``--max-restarts``): a replaced trainer spends from it."""

    @property
    def starts_servers(self) -> bool:
        """Whether this job can start a server while it runs (its placement names a new address)."""

    def new_server_address(self, host: str | None = None) -> str:
        """host:port for a server started mid-job, on ``host`` (SSH: ``--on HOST``) or where the
        placement chooses; ConfigError when that host cannot take one."""

    def start_server(self, rank: "RankSpec") -> "Process":
        """Start ``rank`` as the job's next server (index ``len(servers)``), on its placed host."""

    def start_trainer(self, slot: int, rank: "RankSpec") -> "Process":
        """Start ``rank`` in trainer ``slot`` (the process there has ended), on its placed host."""

    def ask_to_leave(self, slot: int) -> None:
        """Ask the trainer of ``slot`` to leave at its next step boundary (SIGUSR1, locally or
        through the rank's ssh channel: trainer/leave_request.py)."""

    def job_ended(self) -> bool:
        """Every trainer has exited: the job is over and its servers stop."""

    def record(self, event: str, text: str, **fields) -> None:
        """One event in the run directory's event log (``scale_start``, ``scale_failed``, ``replica``...)."""

    def tell_membership(self, change: str, text: str, **fields) -> None:
        """A trainer or server joined, left, was lost or replaced (the run directory's ``membership``
        and ``scale`` events: observe/live/job_watch.py)."""
