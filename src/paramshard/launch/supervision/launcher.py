"""One run of a job: start a JobSpec through an Engine and watch it to its end.

The loop reports every failed rank with its host, stops the job within seconds
of the first failure, and exits with that failure's code (128 + signal for a
signal). Servers that die or hang are restarted in place when the restart
policy (launch/supervision/restart_policy.py) says so; whether the whole job runs again
is the supervisor's question (launch/supervision/supervisor.py), under the same budget.
"""
from __future__ import annotations

import dataclasses
import signal
import threading
import time
from pathlib import Path
from typing import Callable

from paramshard.errors import ConfigError
from paramshard.log import get_logger
from paramshard.launch.api import JobSpec, RankSpec
from paramshard.launch.elastic.control_channel import ControlChannel
from paramshard.launch.elastic.elastic_trainers import ElasticTrainers
from paramshard.launch.supervision.peer_loss import SILENT_AFTER, ServerState, Verdict, decide
from paramshard.launch.engines.process import Engine, Process
from paramshard.launch.supervision.rank_exit import RankExit, failure_summary, first_failure
from paramshard.launch.supervision.restart_policy import Choice, RestartPolicy
from paramshard.launch.supervision.signals import StopSignal, _signals_hurry, signal_number

log = get_logger("launch")


class Launcher:
    """Starts a JobSpec through an Engine and supervises it to the end."""

    def __init__(self, engine: Engine, policy: RestartPolicy | None = None):
        self.engine = engine
        self.servers: list[Process] = []
        self.trainers: list[Process] = []
        self.stopped_by_signal = False
        self.min_trainers: int | None = None     # set: an elastic job, going on while this many trainers are alive
        self.checkpoint_dir: str | None = None
        # The job's one restart budget; the supervisor hands the same one to every run.
        self.policy = policy or RestartPolicy()
        self.restarts_used = 0                   # in-place restarts of this run (they are numbered per run)
        self.server_ranks: list[RankSpec] = []
        self.spec: JobSpec | None = None
        self.incidents: list[str] = []           # what each in-place restart was for, for the end of the job
        self._restarted_at: dict[int, float] = {}   # server index -> when it was last restarted in place
        self._spared_seen: set[tuple[int, int]] = set()   # (server, pid) named but not killed, logged once
        # Told of each in-place restart as (rank name, why): observe/live/job_watch.py records it
        # among the run directory's events.
        self.restart_listeners: list[Callable[[str, str], None]] = []
        # Elastic jobs (min_trainers set): trainers join and leave (launch/elastic/elastic_trainers.py);
        # changes go to these as (change, text, **fields): the run directory's events.
        self.elastic: ElasticTrainers | None = None
        self.membership_listeners: list[Callable[..., None]] = []
        self.control_dir: Path | None = None      # the run directory: `paramshard scale` asks through it
        self.control: ControlChannel | None = None
        self.elastic_servers = None     # `paramshard scale --servers`: launch/elastic/elastic_servers.py, made when asked
        # A Launcher that can start a server mid-job names its address: () -> "host:port" (local engine).
        self.new_server_address: Callable[[], str] | None = None
        # A Launcher whose ranks may go to several hosts places a rank started mid-job (a joining
        # trainer, a new server): RankSpec -> RankSpec on its host (SSH: launch/engines/ssh_placement.py).
        self.place_new_rank: Callable[[RankSpec], RankSpec] | None = None
        # Told of other events as (event, text, **fields), e.g. the replica keeper's: the run directory.
        self.event_listeners: list[Callable[..., None]] = []
        self.keeper = None          # --recovery bounded-loss: launch/elastic/replica_keeper.py

    @property
    def restarts_left(self) -> int:
        return self.policy.left

    @restarts_left.setter
    def restarts_left(self, value: int) -> None:
        self.policy.max_restarts = self.policy.used + value

    def start_job(self, spec: JobSpec) -> None:
        self.spec = spec
        self.server_ranks = list(spec.servers)
        try:
            for rank in spec.servers:
                self.servers.append(self.engine.start(rank))
            if spec.servers and spec.servers[0].env.recovery == "bounded-loss":
                from paramshard.launch.elastic.replica_keeper import ReplicaKeeper
                self.keeper = ReplicaKeeper.for_env(spec.servers[0].env, record=self._event).start()
            for rank in spec.trainers:
                self.trainers.append(self.engine.start(rank))
        except BaseException:
            self.close()
            raise
        if self.min_trainers is not None:
            self.elastic = ElasticTrainers(self, self.min_trainers)
        if self.control_dir is not None:
            self.control = ControlChannel(self.control_dir, {"trainers": self._scale_trainers,
                                                             "servers": self._scale_servers}, ending=self.trainers_done)
            self.control.register("remove_host", self._remove_host, value_type=str)

    def _remove_host(self, text: str) -> str:
        """``scale --remove-host HOST``: SSH jobs only (SshLauncher); this job's ranks all run here."""
        raise ConfigError(f"--remove-host {text}: this job was not launched over SSH (paramshard launch --hosts "
                          f"...); its ranks all run on this machine. Scale them down instead (--trainers N, "
                          f"--servers N)")

    def server_scaler(self):
        """The job's ElasticServers (launch/elastic/elastic_servers.py), made the first time it is needed."""
        if self.elastic_servers is None:
            from paramshard.launch.elastic.elastic_servers import ElasticServers
            self.elastic_servers = ElasticServers(self)
        return self.elastic_servers

    def _scale_trainers(self, n: int) -> str:
        if self.elastic is None:
            raise ConfigError(f"--trainers {n}: this job is not elastic; launch it with --trainers MIN:MAX "
                              f"to change its trainers while it runs")
        return self.elastic.scale(n)

    def _scale_servers(self, n: int, **where) -> str:
        return self.server_scaler().scale(n, **where)      # where: host=... (SSH: scale --servers N --on HOST)

    def _event(self, event: str, text: str, **fields) -> None:
        for listener in self.event_listeners:
            listener(event, text, **fields)

    def _server_states(self, now: float) -> list[ServerState]:
        """Each server as launch/supervision/peer_loss.py sees it: exit code, the peers its last status
        line names, and how long ago that line came. A server a scale removed
        (launch/elastic/elastic_servers.py) is nobody's peer any more: a peer naming it unreachable (it
        retired and exits, or lingers idle until the job ends) is not news, so it is left out of
        every accusation, and it is taken as stopping."""
        retired = set(getattr(self.elastic_servers, "retired", ()) or ())
        states = []
        for i, p in enumerate(self.servers):
            status, at = p.last_status()
            names = {k: v for k, v in (status.unreachable if status else {}).items() if k not in retired}
            gone = tuple(k for k in (status.gone if status else ()) if k not in retired)
            states.append(ServerState(i, p.poll(), names, gone, None if at is None else now - at,
                                      bool(status and status.stopping) or i in retired))
        return states

    def _peer_verdict(self) -> Verdict:
        """Which servers are hung, which died and which died only of a lost peer. A peer may
        still exit for a server restarted less than a timeout (plus its heartbeat) ago."""
        now = time.monotonic()
        window = (self.server_ranks[0].env.timeout if self.server_ranks else 120.0) + 10.0
        recent = [i for i, t in self._restarted_at.items() if now - t < window]
        verdict = decide(self._server_states(now), recent)
        for i, why in verdict.spared.items():
            key = (i, self.servers[i].pid)
            if i not in recent and key not in self._spared_seen:
                self._spared_seen.add(key)
                log.warning("%s: %s", self.servers[i].tag, why)
        return verdict

    def _await_hung(self, seconds: float = SILENT_AFTER) -> Verdict:
        """Every failure so far only lost a peer (e.g. a trainer gave up on a server that
        stopped answering): give the servers' status lines a few seconds to name a hung
        server, so the summary blames it rather than the first to give up."""
        deadline = time.monotonic() + seconds
        while True:
            verdict = self._peer_verdict()
            if verdict.hung or time.monotonic() >= deadline or len(self.servers) < 2:
                return verdict
            time.sleep(0.1)

    def _kill_hung(self, verdict: Verdict) -> dict[Process, str]:
        """SIGKILL the hung servers (a hung process runs no SIGTERM handler); process -> why."""
        hung = {self.servers[i]: why for i, why in verdict.hung.items()}
        for p, why in hung.items():
            log.error("%s (%s) is %s: killing it (SIGKILL)", p.tag, RankExit.brief(p).where(), why)
            p.kill()
        return hung

    def _latest_checkpoint(self) -> Path | None:
        from paramshard.checkpoint.format import checkpoints
        done = checkpoints(self.checkpoint_dir) if self.checkpoint_dir else []
        return done[-1] if done else None

    def _restart_in_place(self, failed: list[Process], verdict: Verdict) -> bool:
        """Dead or hung servers only, restarts left, a checkpoint to roll back to: kill the hung
        ones, start each again on its own address; the trainers wait for them and roll back
        (client/recovery.py). One restart per root cause: a server that exited only because a
        hung or dead peer did comes back with it for free (launch/supervision/peer_loss.py)."""
        keeper = self.keeper
        decision = self.policy.in_place(len(failed), all(p in self.servers for p in failed), len(verdict.hung),
                                        verdict.cost, keeper.latest if keeper else self._latest_checkpoint)
        if decision.choice is Choice.NO_CHECKPOINT:
            log.error("%s: a dead server cannot be restarted in place", "no replica of every server yet" if keeper
                      else f"no checkpoint in {self.checkpoint_dir} yet")
        if not decision.restart:
            return False
        old = list(self.servers)
        hung = self._kill_hung(verdict)
        first = self.restarts_used + 1
        self.policy.spend(decision)
        self.restarts_used += decision.cost
        causes = []
        for i in verdict.restart:
            p, rank = old[i], self.server_ranks[i]
            if p in hung:
                what, causes = f"{p.tag} was hung and is killed", causes + [f"{rank.name} ({hung[p]})"]
            elif i in verdict.casualties:
                what = f"{p.describe_exit()}: it lost a peer server, so no restart is spent on it"
            else:
                what, causes = p.describe_exit(), causes + [f"{rank.name} ({RankExit.brief(p).reason()})"]
            why = (f"{what}; restarting it in place on {rank.env.servers[i]} (restart "
                   f"{first if i in verdict.casualties else self.restarts_used}); " + (
                       "the launcher restores its replica onto it and the trainers resend what failed (no rollback)"
                       if keeper else f"the trainers roll back to the latest checkpoint ({decision.checkpoint.name})"))
            if keeper:
                keeper.note_lost(i, time.monotonic())
            log.warning("%s", why)
            for listener in self.restart_listeners:
                listener(rank.name, why)
            self.servers[i] = self.engine.start(dataclasses.replace(
                rank, env=dataclasses.replace(rank.env, recovering=True)))
            self._restarted_at[i] = time.monotonic()
        spent = (f"restart {first}" if decision.cost == 1 else f"restarts {first}-{self.restarts_used}"
                 if decision.cost else "no restart spent")
        self.incidents.append(f"{spent}: " + ", ".join(causes or ["servers that lost a just restarted peer"]))
        return True

    def wait(self, poll_interval: float = 0.1) -> int:
        """Block until the job ends; 0 when every trainer succeeded (or, with ``min_trainers``,
        enough of them), else the first failure's code."""
        try:
            while True:
                everyone = self.servers + self.trainers
                if self.control is not None:
                    self.control.poll()
                failed = [p for p in everyone if p.poll() not in (None, 0)]
                tolerated = self.elastic.tolerated(failed) if self.elastic else []
                failed = [p for p in failed if p not in tolerated]
                verdict = self._peer_verdict()
                # Every trainer succeeded: the job is over, and its servers are exiting. One that a
                # peer names and that has been silent a while is slow to exit, not hung: nothing
                # needs it any more (close() stops it if it never exits). A failed rank still counts.
                if not failed and all(t.poll() == 0 or t in tolerated for t in self.trainers):
                    return self._finish(len(self.trainers) - len(tolerated), poll_interval)
                if (failed or verdict.hung) and self._restart_in_place(failed, verdict):
                    continue
                if failed:
                    return self._fail(failed, verdict)
                time.sleep(poll_interval)
        except (KeyboardInterrupt, StopSignal) as exc:
            return self.stop_on_signal(signal_number(exc))

    def _fail(self, failed: list[Process], verdict: Verdict) -> int:
        """Some rank failed for good: stop the job and end with the summary; the exit status."""
        everyone = self.servers + self.trainers
        for p in failed:
            log.error("%s", p.describe_exit())
        if not verdict.hung and all(RankExit.of(p).peer_lost for p in failed):
            verdict = self._await_hung()
        # A hung server some peer exited for is the root cause, not the ones that gave up on it.
        hung = self._kill_hung(verdict)
        failed = [*hung, *failed]
        read = [RankExit.of(p) for p in failed]
        first = next(iter(hung)) if hung else failed[read.index(first_failure(read))]
        log.error("stopping the job: %s failed", first.tag)
        stopping_at = time.monotonic()
        # What the others print as they are stopped is not news.
        for p in everyone:
            if p not in failed:
                p.hold_tracebacks()
        self.close()
        late = [p for p in everyone if p not in failed and p.poll() not in (None, 0)]
        for p in late:
            log.info("then: %s", p.describe_exit())
        exits = {p: RankExit.of(p) for p in [*failed, *late]}

        def before_stop(at: float | None) -> bool:
            return at is not None and at < stopping_at
        # Failed on their own: exited, or reported an error, before the launcher stopped them.
        late = [p for p in late if before_stop(exits[p].ended_at) or before_stop(exits[p].failed_at)]
        for p in everyone:
            p.mute()                     # nothing after the summary
        stopped = [exits[p] for p in late if not before_stop(exits[p].ended_at) and exits[p].stopped]
        others = [exits[p] for p in failed if p is not first] + [exits[p] for p in late]
        log.error("%s", failure_summary(exits[first], others, stopped=stopped, why=hung.get(first)))
        return exits[first].status or 1

    def job_ended(self) -> bool:
        """Every trainer has exited: the job is over, its servers stop (a move of partitions
        failing now failed for that: launch/elastic/elastic_servers.py)."""
        return bool(self.trainers) and all(t.poll() is not None for t in self.trainers)

    def trainers_done(self) -> bool:
        """Every trainer succeeded: the job finishes at this loop's next look (a dead one may
        still be replaced: not this)."""
        return bool(self.trainers) and all(t.poll() == 0 for t in self.trainers)

    def _finish(self, succeeded: int, poll_interval: float) -> int:
        if self.control is not None:        # `paramshard scale` hears at once that the job ended
            self.control.close("its trainers finished")
        # Servers exit on their own once every trainer has left.
        deadline = time.monotonic() + 10
        while any(s.poll() is None for s in self.servers) and time.monotonic() < deadline:
            time.sleep(poll_interval)
        self.close()
        log.info("job finished: %d trainers succeeded", succeeded)
        for incident in self.incidents:
            log.info("restarted in place: %s", incident)
        return 0

    def stop_on_signal(self, signum: int) -> int:
        """Stop every process of the job after ``signum``; return the exit status, 128 + signum."""
        self.stopped_by_signal = True
        log.warning("%s received: stopping every process of the job", signal.Signals(signum).name)
        everyone = self.servers + self.trainers
        # Tracebacks of processes dying of the stop (KeyboardInterrupt, peers lost) are noise.
        for p in everyone:
            p.hold_tracebacks()
        hurry = threading.Event()
        with _signals_hurry(hurry):
            self.close(hurry=hurry)
        for p in everyone:
            p.mute()
        for p in everyone:
            if p.withheld:
                log.info("%s: stopped; its traceback is not shown (%s)", p.tag, p.withheld[-1])
        return 128 + signum

    def close(self, grace: float = 5.0, hurry: threading.Event | None = None) -> None:
        # Trainers first, so servers do not log lost clients needlessly; each
        # group is stopped together, so this takes two grace periods at most.
        if self.keeper is not None:
            self.keeper.stop()
            self.keeper = None
        self.engine.stop(self.trainers, grace, hurry)
        self.engine.stop(self.servers, grace, hurry)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
