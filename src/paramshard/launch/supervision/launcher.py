"""One run of a job: start a JobSpec through an Engine and watch it to its end.

The loop reports every failed rank with its host, stops the job within seconds
of the first failure, and exits with that failure's code (128 + signal for a
signal). Servers that die or hang are restarted in place when the restart
policy (launch/supervision/restart_policy.py) says so; whether the whole job runs again
is the supervisor's question (launch/supervision/supervisor.py), under the same budget.

A Launcher is a composition, built by launch/supervision/build.py and never subclassed:
an Engine (starts and stops ranks), a Placement (where they run: the JobSpec, and the
ranks started mid-job), the restart policy, the listeners (launch/supervision/listeners.py)
and the run directory ``paramshard scale`` asks through (its control channel). Its state is
its own: read through properties, changed only by its methods. The elastic controllers
(launch/elastic/) see it as a ``JobControl`` (launch/elastic/job_control.py), which it implements.
"""
from __future__ import annotations

import dataclasses
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from paramshard.errors import ConfigError
from paramshard.log import get_logger
from paramshard.launch.api import JobSpec, LaunchConfig, RankSpec
from paramshard.launch.elastic.control_channel import ControlChannel
from paramshard.launch.elastic.elastic_servers import ElasticServers
from paramshard.launch.elastic.elastic_trainers import ElasticTrainers
from paramshard.launch.elastic.job_control import JobControl
from paramshard.launch.engines.placement import Placement
from paramshard.launch.supervision.listeners import JobListeners
from paramshard.launch.supervision.peer_loss import SILENT_AFTER, ServerState, Verdict, decide
from paramshard.launch.engines.process import Engine, Process
from paramshard.launch.supervision.rank_exit import RankExit, failure_summary, first_failure
from paramshard.launch.supervision.restart_policy import Choice, RestartPolicy
from paramshard.launch.supervision.signals import StopSignal, _signals_hurry, signal_number

log = get_logger("launch")



# `scale --remove-host` to a job whose ranks all run on this machine.
NOT_OVER_SSH = ("--remove-host {}: this job was not launched over SSH (paramshard launch --hosts ...); its ranks "
                "all run on this machine. Scale them down instead (--trainers N, --servers N)")


class Launcher:
    """Starts a JobSpec through an Engine and supervises it to the end (never subclassed:
    what differs between jobs is the engine and placement it is built with)."""

    def __init__(self, engine: Engine, placement: Placement | None = None, *, policy: RestartPolicy | None = None,
                 config: LaunchConfig | None = None, listeners: JobListeners = JobListeners(),
                 control_dir: Path | None = None, min_trainers: int | None = None,
                 checkpoint_dir: str | None = None,
                 server_scaler: Callable[[JobControl], ElasticServers] = ElasticServers,
                 replica_keeper: Callable | None = None):
        """``placement``: None for a JobSpec handed to ``start_job`` (no rank starts mid-job but in
        its own slot); ``policy``: the job's one restart budget (the supervisor's, shared by every
        run); ``control_dir``: the run directory ``paramshard scale`` asks through (None: no
        channel); ``min_trainers``: set, an elastic job going on while this many trainers are alive;
        ``server_scaler(job)``: the job's ElasticServers, made when a scale first asks;
        ``replica_keeper(env, record)``: the started keeper of a ``--recovery bounded-loss`` job
        (default: launch/elastic/replica_keeper.py's)."""
        self._engine = engine
        self._placement = placement
        self._policy = policy or RestartPolicy()
        self._config = config
        self._listeners = listeners
        self._control_dir = control_dir
        self._min_trainers = min_trainers
        self._checkpoint_dir = checkpoint_dir
        self._make_server_scaler = server_scaler
        self._make_keeper = replica_keeper
        self._spec: JobSpec | None = None
        self._servers: list[Process] = []
        self._trainers: list[Process] = []
        # The rank each process was started as (a server restarted in place, a trainer replaced in its
        # slot: the latest), on its placed host: `scale --remove-host` reads where each one runs.
        self._server_ranks: list[RankSpec] = []
        self._trainer_ranks: list[RankSpec] = []
        self._stopped_by_signal = False
        self._restarts_used = 0                   # in-place restarts of this run (they are numbered per run)
        self._incidents: list[str] = []           # what each in-place restart was for, for the end of the job
        self._restarted_at: dict[int, float] = {}   # server index -> when it was last restarted in place
        self._spared_seen: set[tuple[int, int]] = set()   # (server, pid) named but not killed, logged once
        self._elastic: ElasticTrainers | None = None         # min_trainers set: launch/elastic/elastic_trainers.py
        self._elastic_servers: ElasticServers | None = None  # `paramshard scale --servers`, made when asked
        self._control: ControlChannel | None = None
        self._keeper = None          # --recovery bounded-loss: launch/elastic/replica_keeper.py

    # -- what others read --------------------------------------------------------
    @property
    def config(self) -> LaunchConfig | None:
        return self._config

    @property
    def spec(self) -> JobSpec:
        """The job as it started (JobControl): asked once it has."""
        if self._spec is None:
            raise RuntimeError("the job has not started: its JobSpec is made by start() or given to start_job()")
        return self._spec

    @property
    def servers(self) -> list[Process]:
        return list(self._servers)

    @property
    def trainers(self) -> list[Process]:
        return list(self._trainers)

    @property
    def addresses(self) -> list[str]:
        """Where the job's first servers listen (a scale's are told by its routing)."""
        return list(self._spec.servers[0].env.servers) if self._spec and self._spec.servers else []

    @property
    def policy(self) -> RestartPolicy:
        return self._policy

    @property
    def restarts_left(self) -> int:
        return self._policy.left

    @property
    def restarts_used(self) -> int:
        return self._restarts_used

    @property
    def incidents(self) -> list[str]:
        return list(self._incidents)

    @property
    def stopped_by_signal(self) -> bool:
        return self._stopped_by_signal

    @property
    def elastic(self) -> ElasticTrainers | None:
        return self._elastic

    # -- JobControl (launch/elastic/job_control.py) ------------------------------
    @property
    def starts_servers(self) -> bool:
        return self._placement is not None

    def new_server_address(self, host: str | None = None) -> str:
        if self._placement is None:
            raise ConfigError("this job cannot start a server mid-job: it was started without a placement")
        return self._placement.new_server_address(host)

    def _placed(self, rank: RankSpec) -> RankSpec:
        return self._placement.place_rank(rank) if self._placement is not None else rank

    def start_server(self, rank: RankSpec) -> Process:
        rank = self._placed(rank)       # SSH: on the host its address is on
        process = self._engine.start(rank)
        self._server_ranks.append(rank)
        self._servers.append(process)
        return process

    def start_trainer(self, slot: int, rank: RankSpec) -> Process:
        rank = self._placed(rank)       # SSH: the least loaded host
        process = self._engine.start(rank)
        self._trainer_ranks[slot], self._trainers[slot] = rank, process
        return process

    def ask_to_leave(self, slot: int) -> None:
        self._engine.ask_to_leave(self._trainers[slot])

    def record(self, event: str, text: str, **fields) -> None:
        self._listeners.event(event, text, **fields)

    def tell_membership(self, change: str, text: str, **fields) -> None:
        self._listeners.member(change, text, **fields)

    # -- a run -------------------------------------------------------------------
    def _running_ranks(self) -> list[RankSpec]:
        """The ranks running now, as started (mid-job placement counts them per host)."""
        pairs = [*zip(self._server_ranks, self._servers), *zip(self._trainer_ranks, self._trainers)]
        return [rank for rank, p in pairs if p.poll() is None]

    def start(self) -> "Launcher":
        """Place every rank (its host and address) and start the job."""
        if self._placement is None:
            raise ConfigError("this Launcher has no placement: start a JobSpec with start_job, or build the "
                              "launcher with build_launcher (launch/supervision/build.py)")
        spec = self._placement.job_spec(self._running_ranks, self.record)
        self.start_job(spec)
        log.info("%s", self._placement.describe(spec))
        return self

    def start_job(self, spec: JobSpec) -> None:
        self._spec = spec
        try:
            for rank in spec.servers:
                self._server_ranks.append(rank)
                self._servers.append(self._engine.start(rank))
            if spec.servers and spec.servers[0].env.recovery == "bounded-loss":
                self._keeper = self._start_keeper(spec.servers[0].env)
            for rank in spec.trainers:
                self._trainer_ranks.append(rank)
                self._trainers.append(self._engine.start(rank))
        except BaseException:
            self.close()
            raise
        if self._min_trainers is not None:
            self._elastic = ElasticTrainers(self, self._min_trainers)
        if self._control_dir is not None:
            placement = self._placement if self._placement is not None and self._placement.on_hosts else None
            self._control = ControlChannel(self._control_dir, {"trainers": self._scale_trainers},
                                           ending=self.trainers_done)
            self._control.register("servers", self._scale_servers, takes_host=placement is not None)  # --on HOST
            self._control.register("remove_host", self._remove_host, value_type=str)
            if placement is not None:            # `paramshard scale RUN_DIR --add-host HOST` (SSH)
                self._control.register("add_host", placement.add_host, value_type=str)

    def _start_keeper(self, env):
        if self._make_keeper is not None:
            return self._make_keeper(env, self.record)
        from paramshard.launch.elastic.replica_keeper import ReplicaKeeper
        return ReplicaKeeper.for_env(env, record=self.record).start()

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Block until every server answers; raise naming the ones that do not."""
        from paramshard.client.control import wait_for_servers
        if self._config is None:
            raise ConfigError("wait_ready needs the launcher's LaunchConfig (build_launcher gives it one)")
        wait_for_servers(self._config.base_env(self.addresses), who="launcher", timeout=timeout)

    # -- `paramshard scale` (launch/elastic/control_channel.py) ------------------
    def server_scaler(self) -> ElasticServers:
        """The job's ElasticServers (launch/elastic/elastic_servers.py), made the first time it is needed."""
        if self._elastic_servers is None:
            self._elastic_servers = self._make_server_scaler(self)
        return self._elastic_servers

    def _scale_trainers(self, n: int) -> str:
        if self._elastic is None:
            raise ConfigError(f"--trainers {n}: this job is not elastic; launch it with --trainers MIN:MAX "
                              f"to change its trainers while it runs")
        return self._elastic.scale(n)

    def _scale_servers(self, n: int, **where) -> str:
        return self.server_scaler().scale(n, **where)      # where: host=... (SSH: scale --servers N --on HOST)

    def _remove_host(self, text: str) -> str:
        """``scale --remove-host HOST`` (jobs whose placement is on hosts: SSH): checked whole first
        (launch/elastic/host_removal.py: nothing moves on a refusal), then the host's servers give their
        partitions and blocks to the others in the background (they retire and exit as removed servers
        do), its trainers leave at their step boundary, and no rank started later goes there."""
        if self._placement is None or not self._placement.on_hosts:
            raise ConfigError(NOT_OVER_SSH.format(text))
        from paramshard.launch.elastic.host_removal import plan_removal
        host = self._placement.find(text)
        elastic = self._elastic
        scaler = self._elastic_servers
        serving = scaler.serving if scaler is not None else list(range(len(self._servers)))
        staying = elastic.staying() if elastic is not None else \
            [slot for slot, p in enumerate(self._trainers) if p.poll() is None]
        # A job on hosts places every rank on one (RankSpec.host is None only for this machine).
        plan = plan_removal(host.host, {s: self._server_ranks[s].host or "" for s in serving},
                            {t: self._trainer_ranks[t].host or "" for t in staying},
                            partitions=self.spec.servers[0].env.partitions, min_trainers=self._min_trainers,
                            max_trainers=len(self._trainers), moving=scaler is not None and scaler.moving())
        done = []
        if plan.servers:
            self.server_scaler().remove(plan.servers)
            done.append(f"moving the partitions and dense blocks of servers {plan.servers} to servers "
                        f"{plan.servers_after} in the background (a scale_end event marks the end; they exit "
                        f"once no trainer routes to them)")
        if plan.trainers:
            assert elastic is not None, "plan_removal refuses trainers to a job that is not elastic"
            elastic.ask_to_leave(plan.trainers)
            done.append(f"asked trainers {plan.trainers} to leave at their next step boundary "
                        f"({len(staying)} -> {plan.trainers_after} trainers)")
        self._placement.remove_host(host)
        message = (f"host {host.target} removed from the job: " + "; ".join(done or ["it ran no rank"]) +
                   f"; no rank started from now on goes there")
        log.info("%s", message)
        self.record("host_removed", message, host=host.target, servers=plan.servers,
                    servers_after=plan.servers_after, trainers=plan.trainers, trainers_after=plan.trainers_after)
        return message

    def unfinished_move(self) -> str | None:
        """A move of partitions (`paramshard scale --servers`) still under way as the job ends stops
        unfinished with the servers: the text saying so, the first time it is asked (None: no move
        under way, or the move said it already: launch/elastic/elastic_servers.py)."""
        scaler = self._elastic_servers
        if scaler is None or not scaler.moving():
            return None
        return scaler.cut_by_job_end("the job ended during the move of partitions a `paramshard scale --servers` "
                                     "asked for: the move stopped unfinished with the servers (nothing to restart)")

    # -- the loop ----------------------------------------------------------------
    def _server_states(self, now: float) -> list[ServerState]:
        """Each server as launch/supervision/peer_loss.py sees it: exit code, the peers its last status
        line names, and how long ago that line came. A server a scale removed
        (launch/elastic/elastic_servers.py) is nobody's peer any more: a peer naming it unreachable (it
        retired and exits, or lingers idle until the job ends) is not news, so it is left out of
        every accusation, and it is taken as stopping."""
        retired = set(self._elastic_servers.retired) if self._elastic_servers is not None else set()
        states = []
        for i, p in enumerate(self._servers):
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
        window = (self._server_ranks[0].env.timeout if self._server_ranks else 120.0) + 10.0
        recent = [i for i, t in self._restarted_at.items() if now - t < window]
        verdict = decide(self._server_states(now), recent)
        for i, why in verdict.spared.items():
            key = (i, self._servers[i].pid)
            if i not in recent and key not in self._spared_seen:
                self._spared_seen.add(key)
                log.warning("%s: %s", self._servers[i].tag, why)
        return verdict

    def _await_hung(self, seconds: float = SILENT_AFTER) -> Verdict:
        """Every failure so far only lost a peer (e.g. a trainer gave up on a server that
        stopped answering): give the servers' status lines a few seconds to name a hung
        server, so the summary blames it rather than the first to give up."""
        deadline = time.monotonic() + seconds
        while True:
            verdict = self._peer_verdict()
            if verdict.hung or time.monotonic() >= deadline or len(self._servers) < 2:
                return verdict
            time.sleep(0.1)

    def _kill_hung(self, verdict: Verdict) -> dict[Process, str]:
        """SIGKILL the hung servers (a hung process runs no SIGTERM handler); process -> why."""
        hung = {self._servers[i]: why for i, why in verdict.hung.items()}
        for p, why in hung.items():
            log.error("%s (%s) is %s: killing it (SIGKILL)", p.tag, RankExit.brief(p).where(), why)
            p.kill()
        return hung

    def _latest_checkpoint(self) -> Path | None:
        from paramshard.checkpoint.format import checkpoints
        done = checkpoints(self._checkpoint_dir) if self._checkpoint_dir else []
        return done[-1] if done else None

    def _restart_in_place(self, failed: list[Process], verdict: Verdict) -> bool:
        """Dead or hung servers only, restarts left, a checkpoint to roll back to: kill the hung
        ones, start each again on its own address; the trainers wait for them and roll back
        (client/recovery.py). One restart per root cause: a server that exited only because a
        hung or dead peer did comes back with it for free (launch/supervision/peer_loss.py)."""
        keeper = self._keeper
        decision = self._policy.in_place(len(failed), all(p in self._servers for p in failed), len(verdict.hung),
                                        verdict.cost, keeper.latest if keeper else self._latest_checkpoint)
        if decision.choice is Choice.NO_CHECKPOINT:
            log.error("%s: a dead server cannot be restarted in place", "no replica of every server yet" if keeper
                      else f"no checkpoint in {self._checkpoint_dir} yet")
        if not decision.restart:
            return False
        # A restart is to a checkpoint (or the keeper's replica): the policy names it.
        checkpoint_name = decision.checkpoint.name if decision.checkpoint is not None else "?"
        old = list(self._servers)
        hung = self._kill_hung(verdict)
        first = self._restarts_used + 1
        self._policy.spend(decision)
        self._restarts_used += decision.cost
        causes: list[str] = []
        for i in verdict.restart:
            p, rank = old[i], self._server_ranks[i]
            if p in hung:
                what, causes = f"{p.tag} was hung and is killed", causes + [f"{rank.name} ({hung[p]})"]
            elif i in verdict.casualties:
                what = f"{p.describe_exit()}: it lost a peer server, so no restart is spent on it"
            else:
                what, causes = p.describe_exit(), causes + [f"{rank.name} ({RankExit.brief(p).reason()})"]
            why = (f"{what}; restarting it in place on {rank.env.servers[i]} (restart "
                   f"{first if i in verdict.casualties else self._restarts_used}); " + (
                       "the launcher restores its replica onto it and the trainers resend what failed (no rollback)"
                       if keeper else f"the trainers roll back to the latest checkpoint ({checkpoint_name})"))
            if keeper:
                keeper.note_lost(i, time.monotonic())
            log.warning("%s", why)
            self._listeners.restart(rank.name, why)
            again = dataclasses.replace(rank, env=dataclasses.replace(rank.env, recovering=True))
            self._servers[i], self._server_ranks[i] = self._engine.start(again), again
            self._restarted_at[i] = time.monotonic()
        spent = (f"restart {first}" if decision.cost == 1 else f"restarts {first}-{self._restarts_used}"
                 if decision.cost else "no restart spent")
        self._incidents.append(f"{spent}: " + ", ".join(causes or ["servers that lost a just restarted peer"]))
        return True

    def wait(self, poll_interval: float = 0.1) -> int:
        """Block until the job ends; 0 when every trainer succeeded (or, with ``min_trainers``,
        enough of them), else the first failure's code."""
        try:
            while True:
                everyone = self._servers + self._trainers
                if self._control is not None:
                    self._control.poll()
                failed = [p for p in everyone if p.poll() not in (None, 0)]
                tolerated = self._elastic.tolerated(failed) if self._elastic else []
                failed = [p for p in failed if p not in tolerated]
                verdict = self._peer_verdict()
                # Every trainer succeeded: the job is over, and its servers are exiting. One that a
                # peer names and that has been silent a while is slow to exit, not hung: nothing
                # needs it any more (close() stops it if it never exits). A failed rank still counts.
                if not failed and all(t.poll() == 0 or t in tolerated for t in self._trainers):
                    return self._finish(len(self._trainers) - len(tolerated), poll_interval)
                if (failed or verdict.hung) and self._restart_in_place(failed, verdict):
                    continue
                if failed:
                    return self._fail(failed, verdict)
                time.sleep(poll_interval)
        except (KeyboardInterrupt, StopSignal) as exc:
            return self.stop_on_signal(signal_number(exc))

    def _fail(self, failed: list[Process], verdict: Verdict) -> int:
        """Some rank failed for good: stop the job and end with the summary; the exit status."""
        everyone = self._servers + self._trainers
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
        summary = failure_summary(exits[first], others, stopped=stopped, why=hung.get(first))
        log.error("%s", summary)
        # The run directory's record of it: `paramshard report` says it first.
        self.record("failure", summary, rank=first.tag, exit_code=exits[first].status or 1)
        return exits[first].status or 1

    def job_ended(self) -> bool:
        """Every trainer has exited: the job is over, its servers stop (a move of partitions
        failing now failed for that: launch/elastic/elastic_servers.py)."""
        return bool(self._trainers) and all(t.poll() is not None for t in self._trainers)

    def trainers_done(self) -> bool:
        """Every trainer succeeded: the job finishes at this loop's next look (a dead one may
        still be replaced: not this)."""
        return bool(self._trainers) and all(t.poll() == 0 for t in self._trainers)

    def _finish(self, succeeded: int, poll_interval: float) -> int:
        if self._control is not None:        # `paramshard scale` hears at once that the job ended
            self._control.close("its trainers finished")
        # Servers exit on their own once every trainer has left.
        deadline = time.monotonic() + 10
        while any(s.poll() is None for s in self._servers) and time.monotonic() < deadline:
            time.sleep(poll_interval)
        self.close()
        log.info("job finished: %d trainers succeeded", succeeded)
        for incident in self._incidents:
            log.info("restarted in place: %s", incident)
        return 0

    def stop_on_signal(self, signum: int) -> int:
        """Stop every process of the job after ``signum``; return the exit status, 128 + signum."""
        self._stopped_by_signal = True
        log.warning("%s received: stopping every process of the job", signal.Signals(signum).name)
        everyone = self._servers + self._trainers
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
        if self._keeper is not None:
            self._keeper.stop()
            self._keeper = None
        self._engine.stop(self._trainers, grace, hurry)
        self._engine.stop(self._servers, grace, hurry)

    def __enter__(self) -> "Launcher":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


if TYPE_CHECKING:   # `make typecheck` checks the contract: JobControl (launch/elastic/job_control.py)
    _job_control: type[JobControl] = Launcher
