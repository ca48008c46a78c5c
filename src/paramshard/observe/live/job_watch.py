"""What `paramshard launch` adds around a job to see it: the run directory, the
watcher of the servers, the live progress, and at the end the summary and,
if asked, the report. One object, so the launcher's own code stays about
starting and supervising processes."""
from __future__ import annotations

import dataclasses
import sys
from typing import TYPE_CHECKING

from paramshard.errors import ParamshardError
from paramshard.log import get_logger
from paramshard.observe.live.monitor import Monitor
from paramshard.observe.live.progress import Progress
from paramshard.observe.run_records.run_dir import RunDir

if TYPE_CHECKING:
    from paramshard.transport.links import ServerLinks

log = get_logger("launch")


class JobWatch:
    def __init__(self, path, job_id: str, report: bool = False, out=None):
        self.run = RunDir(path, job_id)
        self.report = report
        self.progress = Progress(out or sys.stdout)
        self.monitor: Monitor | None = None
        self._links: ServerLinks | None = None      # the monitor's, to every server of the current run

    def launcher_options(self) -> dict:
        """What each run's Launcher is built with (launch/supervision/build.py): every process's output
        through the run directory, above the live table; `paramshard scale RUN_DIR` asks the
        launcher through it. Its listeners are ``listeners()``."""
        return dict(out=self.progress.writer(), tap_for=self.run.tap_for, control_dir=self.run.path)

    def listeners(self) -> dict:
        """Restarts, membership changes and events as the run directory's events: the fields of
        the launcher's JobListeners (launch/supervision/listeners.py), which the command that
        builds the launcher makes of them (observe/ imports nothing of launch/)."""
        return dict(restarted=(self.restarted,), membership=(self.membership,), events=(self.run.event,))

    def membership(self, change: str, text: str, trainer: int | None = None, **fields) -> None:
        """An elastic job's trainers changed (launch/elastic/elastic_trainers.py): a ``membership`` event
        (``role``, ``rank``, ``change``, ``live``: what observe/run_records/elastic_view.py reads), or for
        a ``paramshard scale`` request a ``scale`` event with the ``trainers`` asked for."""
        if change == "scale":
            self.run.event("scale", text, role="trainer", **fields)
            return
        if fields.get("role") == "server":          # launch/elastic/elastic_servers.py: added, removed
            self.run.event("membership", text, rank=f"server {fields['server']}", change=change, **fields)
            return
        self.run.event("membership", text, role="trainer", rank=f"trainer {trainer}", change=change,
                       trainer=trainer, **fields)

    def _unfinished_move(self, launcher) -> None:
        """A move of partitions (`paramshard scale --servers`) still under way as the job ends
        stops unfinished with the servers: say so, once, as what it is (the job's end, not an
        error to restart for), unless the move already said it (Launcher.unfinished_move)."""
        text = launcher.unfinished_move() if launcher is not None else None
        if text is not None:
            log.info("%s", text)
            self.run.event("scale_failed", text, job_ended=True)

    def restarted(self, rank: str, why: str) -> None:
        """A restart, in the run directory's events (and so the report's table): which rank
        ("job" for all of them), when (the record's time) and why."""
        self.run.event("restart", why, rank=rank)

    def started(self, launcher) -> None:
        """The processes are up: write the configuration, start watching the servers."""
        from paramshard.client import control
        spec = launcher.spec
        self.run.write_config(launcher.config, [*spec.servers, *spec.trainers])
        self.run.event("start", f"{len(spec.servers)} servers, {len(spec.trainers)} trainers")
        self._stop_monitor()            # a restarted job has new servers
        env = launcher.config.base_env(launcher.addresses)
        self._links = control.connect(env, who="launcher (run directory)", timeout=10.0)
        # An elastic job's servers may change (`paramshard scale --servers`): follow its routing.
        connect_one = (lambda address: control.connect(dataclasses.replace(env, servers=(address,)),
                                                       who="launcher (run directory)", timeout=10.0)) \
            if launcher.config.partitions else None
        self.monitor = Monitor(self.run, self._links, self.progress, connect_one=connect_one).start()

    def _stop_monitor(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()
            self.monitor = None
        if self._links is not None:
            self._links.close()
            self._links = None

    def finished(self, code: int, launcher) -> None:
        self._stop_monitor()
        self._unfinished_move(launcher)
        self.progress.close()
        self.run.event("end", f"exit code {code}")
        processes = (launcher.servers + launcher.trainers) if launcher is not None else []
        self.run.write_summary(code, processes)
        self.run.close()
        log.info("run directory: %s (paramshard report %s)", self.run.path, self.run.path)
        if self.report:
            from paramshard.observe.report.report_files import write_report
            try:
                log.info("report: %s", write_report(self.run.path))
            except (ParamshardError, OSError) as exc:
                log.error("no report: %s", exc)
