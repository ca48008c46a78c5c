"""One contract for launching a job, whatever starts the processes.

- ``LaunchConfig``: what the user asked for (script, counts, mode, security).
- ``JobSpec``: every rank with its host and its environment contract.
- ``Engine``: starts one rank somewhere and hands back a ``Process``
  (poll / describe_exit / stop); the local engine and the SSH engine are two
  implementations, MPI, Slurm and Kubernetes plug in the same way.
- ``Launcher``: the one supervision loop. It reports every failed rank with
  its host, stops the job within seconds of the first failure, and exits
  with that failure's code (128 + signal for a signal).
"""
from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from typing import Mapping, Protocol, Sequence

from ..env import ClusterEnv, check_server_count
from ..errors import ConfigError
from ..log import get_logger
from ..settings.fields import launched, with_fields
from ..settings.process import GLIBC_TUNABLES, MKL_THREADS, OMP_THREADS
from ..settings.setting import LAUNCH
from ..transport.security import new_secret
from .peer_loss import SILENT_AFTER, ServerState, Verdict, decide
from .signals import StopSignal, _signals_hurry, signal_number
from .status import PEER_LOST_EXIT_CODE
from .target import check as check_target, command_words

log = get_logger("launch")

# libzmq mallocs every received message. With glibc's defaults a big message
# gets fresh pages (mmap, or a heap that was just trimmed), so page faults
# dominate large transfers. Keep everything up to 32 MiB on a heap that is
# never trimmed, and back larger blocks with transparent huge pages. Measured
# (benchmarks/RESULTS.md): 16 MiB push+pull 0.55x -> 0.76x of raw pyzmq under
# the same settings; 64 MiB round trip 152 -> 87 ms.
MALLOC_TUNABLES = ("glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=33554432:"
                   "glibc.malloc.trim_threshold=2147483648")

# torch (OpenMP) and MKL size their thread pools by the host's cores, once per process: S + T
# processes on one host would each start a pool of all its cores and fight over them.
THREAD_VARIABLES = (OMP_THREADS.env, MKL_THREADS.env)


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity (taskset, a cgroup cpuset), else all."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:           # not Linux
        return os.cpu_count() or 1


def thread_environ(cpus: int, processes: int, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """OMP_NUM_THREADS and MKL_NUM_THREADS for one of ``processes`` sharing ``cpus``: an equal
    share, at least 1. A user's OMP_NUM_THREADS (in ``environ``, the launcher's) wins, as
    does a MKL_NUM_THREADS of theirs; both are passed on as they are."""
    environ = os.environ if environ is None else environ
    own = {name: environ[name] for name in THREAD_VARIABLES if environ.get(name)}
    if "OMP_NUM_THREADS" in own:
        return own
    return {**dict.fromkeys(THREAD_VARIABLES, str(max(1, cpus // processes))), **own}


@dataclasses.dataclass(frozen=True)
@with_fields(LAUNCH)
class LaunchConfig:
    """What the user asked for. The launcher's own fields are below; every setting the launcher
    passes on to the ranks (scope LAUNCH in settings/contract.py: trainers, mode, timeout, secret,
    checkpoints, ...) is a field too, generated from the table and copied by ``base_env``. A
    secret of None means one is made for the job (CurveZMQ), unless keys_dir or insecure."""
    script: str | None = None      # what each trainer runs: a script, or `module` below
    script_args: tuple[str, ...] = ()
    servers: int = 1
    host: str = "127.0.0.1"
    check_script: bool = True      # False when the script lives on other hosts only
    module: str | None = None      # a module, run as python -m (script_args are then its arguments)

    def __post_init__(self):
        check_server_count(self.mode, self.servers)
        if not (self.secret or self.keys_dir or self.insecure):
            # The launcher owns every rank's environment: encrypt unless told otherwise.
            object.__setattr__(self, "secret", new_secret())
        if self.mode in ("collective", "hybrid") and (self.checkpoint_dir or self.resume or self.max_restarts):
            raise ConfigError(f"--mode {self.mode}: checkpoints are not available in this mode yet "
                              f"(drop --checkpoint-dir, --resume and --max-restarts, or use sync mode)")
        if self.trainers < 1:
            raise ConfigError(f"--trainers {self.trainers}: a job needs at least one trainer")
        if self.max_staleness is not None and self.mode != "async":
            raise ConfigError(f"--max-staleness {self.max_staleness}: bounds async staleness; sync mode "
                              f"already waits for every trainer each step (use --mode async)")
        if self.min_trainers is not None and (self.mode != "async" or not 1 <= self.min_trainers <= self.trainers):
            raise ConfigError(f"--min-trainers {self.min_trainers}: needs --mode async (a sync step needs every "
                              f"trainer) and a value in 1..{self.trainers}")
        check_target(self.script, self.module)
        # A module is looked for where the trainers run: a missing one fails them like any error.
        if self.check_script and self.script is not None and not os.path.isfile(self.script):
            raise ConfigError(f"training script {self.script!r} not found")
        # Building the contract validates mode, dispatch, block size, timeout.
        self.base_env(["127.0.0.1:1"] * self.servers, "127.0.0.1:1" if self.collective else None)

    @property
    def collective(self) -> bool:
        """The trainers form a process group (collective, hybrid): trainer 0 hosts its store."""
        return self.mode in ("collective", "hybrid")

    def base_env(self, servers: Sequence[str], collective_addr: str | None = None) -> ClusterEnv:
        """Every rank's contract but its role: the settings this config carries (generated)."""
        return ClusterEnv(role=None, servers=tuple(servers), collective_addr=collective_addr, **launched(self))


@dataclasses.dataclass(frozen=True)
class RankSpec:
    name: str                      # "server 0", "trainer 1"
    env: ClusterEnv                # its whole environment contract
    argv: tuple[str, ...]          # what runs (the engine decides where and how)
    host: str | None = None        # None: this machine
    # Variables beyond the contract, for every engine alike (the thread counts).
    extra_environ: tuple[tuple[str, str], ...] = ()

    @property
    def tag(self) -> str:
        return f"{self.host} | {self.name}" if self.host else self.name

    def environ(self) -> dict[str, str]:
        """The variables this rank needs beyond its host's own environment."""
        out = self.env.to_environ()
        out.update(self.extra_environ)
        out["PYTHONUNBUFFERED"] = "1"
        given = GLIBC_TUNABLES.read(os.environ)
        out[GLIBC_TUNABLES.env] = MALLOC_TUNABLES if given is None else given
        return out


@dataclasses.dataclass(frozen=True)
class JobSpec:
    servers: tuple[RankSpec, ...]
    trainers: tuple[RankSpec, ...]

    @classmethod
    def build(cls, config: LaunchConfig, addresses: Sequence[str], python: str,
              server_hosts: Sequence[str | None] | None = None,
              trainer_hosts: Sequence[str | None] | None = None, script: str | None = None,
              threads: Mapping[str | None, dict[str, str]] | None = None,
              collective_addr: str | None = None) -> "JobSpec":
        """Rank -> environment. ``addresses``: where each server listens (its own host's
        address); ``*_hosts``: where each rank runs (None entries: this machine); ``script``:
        the script's path where it runs; ``threads``: host -> its thread variables (default:
        this machine's CPUs shared by the ranks placed on it, see ``thread_environ``);
        ``collective_addr``: where trainer 0 hosts the trainers' store (collective, hybrid)."""
        if config.collective and not collective_addr:
            raise ConfigError(f"{config.mode} mode: the trainers' store address (trainer 0's host:port) is missing")
        base = config.base_env(addresses, collective_addr)
        server_hosts = server_hosts or [None] * config.servers
        trainer_hosts = trainer_hosts or [None] * config.trainers
        if threads is None:      # the ranks on this machine share its CPUs (other hosts: nothing set)
            here = [*server_hosts, *trainer_hosts].count(None)
            threads = {None: thread_environ(usable_cpus(), here)} if here else {}
        trainer_argv = (python, *command_words(script or config.script, config.module, config.script_args))

        def rank(name: str, env: ClusterEnv, argv: tuple[str, ...], host: str | None) -> RankSpec:
            return RankSpec(name, env, argv, host, tuple(sorted(threads.get(host, {}).items())))

        servers = tuple(rank(f"server {i}", dataclasses.replace(base, role="server", server_id=i),
                             (python, "-m", "paramshard", "server"), server_hosts[i])
                        for i in range(config.servers))
        trainers = tuple(rank(f"trainer {i}", dataclasses.replace(base, role="trainer", trainer_id=i),
                              trainer_argv, trainer_hosts[i])
                         for i in range(config.trainers))
        return cls(servers, trainers)


class Process(Protocol):
    tag: str

    def poll(self) -> int | None: ...

    def describe_exit(self) -> str: ...


class Engine(Protocol):
    def start(self, rank: RankSpec) -> Process:
        """Start one rank; raise ConfigError naming the rank or host when that fails."""

    def stop(self, processes: Sequence[Process], grace: float, hurry: threading.Event | None) -> None:
        """Stop these processes together: TERM, one shared grace period, then KILL."""


def exit_status(code: int) -> int:
    """A process's return code as a shell would report it (128 + signal for a signal)."""
    return 128 - code if code < 0 else code


# In a process's last lines: it failed because another one did.
PEER_LOST_MARKERS = ("peer_lost", "lost its connection", "lost their connection", "ServerUnavailable")


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_reason(p: Process) -> str:
    """'exit code 1', 'killed by SIGKILL', ... for a process that ended."""
    code = p.poll()
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {_signal_name(-code)}"
    if code == 255 and getattr(p, "host", None) is not None:
        return "exit code 255: ssh failed or lost its connection"
    if 128 < code <= 128 + 64 and _signal_name(code - 128).startswith("SIG"):
        return f"exit code {code}, i.e. 128 + {_signal_name(code - 128)}?"
    return f"exit code {code}"


def rank_name(p: Process) -> str:
    """'trainer 1' for a tag 'trainer 1' or '10.0.0.2 | trainer 1'."""
    return p.tag.rpartition(" | ")[2]


def where(p: Process) -> str:
    host = p.tag.rpartition(" | ")[0]
    if host:
        return f"on {host}"
    pid = getattr(p, "pid", None)
    return f"pid {pid} on this machine" if pid is not None else "on this machine"


def error_excerpt(p: Process) -> list[str]:
    """The last lines of the process's own error (processes.error_excerpt), if it keeps them."""
    excerpt = getattr(p, "error_excerpt", None)
    return excerpt() if excerpt is not None else []


def lost_a_peer(p: Process) -> bool:
    """It failed because another process did: a server's own exit code says so
    (PEER_LOST_EXIT_CODE), a trainer's error names the lost peer."""
    if p.poll() == PEER_LOST_EXIT_CODE and getattr(p, "tag", "").rpartition(" | ")[2].startswith("server "):
        return True
    return any(m in line for line in error_excerpt(p) for m in PEER_LOST_MARKERS)


def _failed_at(p: Process) -> float:
    t = getattr(p, "failed_at", lambda: None)()
    return t if t is not None else float("inf")


def first_failure(failed: Sequence[Process]) -> Process:
    """The root cause among processes seen failed together: one that did not just lose a
    peer, the earliest to report its error (list order when nothing tells)."""
    return min(failed, key=lambda p: (lost_a_peer(p), _failed_at(p), failed.index(p)))


def failure_summary(first: Process, others: Sequence[Process], stopped: Sequence[Process] = (),
                    max_others: int = 8, why: str | None = None) -> str:
    """The block a failed job ends with: the first failure, its own error, and the
    processes that failed after it (marked when they only lost a peer); ``stopped``:
    those of them the launcher had to stop after they reported their error; ``why``:
    the launcher's own finding about the first (a hung server it killed)."""
    if why:
        lines = [f"first failure: {rank_name(first)} ({why}; the launcher killed it: {exit_reason(first)}; "
                 f"{where(first)})"]
    else:
        lines = [f"first failure: {rank_name(first)} ({exit_reason(first)}; {where(first)})"]
    excerpt = error_excerpt(first)
    lines += [f"    {line}" for line in excerpt] if excerpt else ["    (it printed nothing)"]
    for p in others[:max_others]:
        reason = "then stopped by the launcher" if p in stopped else exit_reason(p)
        if lost_a_peer(p):
            lines.append(f"  {p.tag}: failed after {rank_name(first)} (peer lost; {reason})")
        else:
            own = error_excerpt(p)
            lines.append(f"  {p.tag}: failed after {rank_name(first)} ({reason})" + (f": {own[-1]}" if own else ""))
    if len(others) > max_others:
        lines.append(f"  ... and {len(others) - max_others} more failed after {rank_name(first)}")
    return "\n".join(lines)


def _each(processes: Sequence[Process], method: str) -> None:
    for p in processes:
        call = getattr(p, method, None)
        if call is not None:
            call()


class Launcher:
    """Starts a JobSpec through an Engine and supervises it to the end."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.servers: list = []
        self.trainers: list = []
        self.stopped_by_signal = False
        self.min_trainers: int | None = None     # async: keep going while this many trainers are alive
        self._tolerated_seen: list = []
        self.checkpoint_dir: str | None = None
        self.restarts_left = 0                   # dead servers this launcher may restart in place
        self.restarts_used = 0
        self.server_ranks: list[RankSpec] = []
        self.spec: JobSpec | None = None
        self.incidents: list[str] = []           # what each in-place restart was for, for the end of the job
        self._restarted_at: dict[int, float] = {}   # server index -> when it was last restarted in place
        self._spared_seen: set[tuple[int, int]] = set()   # (server, pid) named but not killed, logged once

    def start_job(self, spec: JobSpec) -> None:
        self.spec = spec
        self.server_ranks = list(spec.servers)
        try:
            for rank in spec.servers:
                self.servers.append(self.engine.start(rank))
            for rank in spec.trainers:
                self.trainers.append(self.engine.start(rank))
        except BaseException:
            self.close()
            raise

    def _tolerated(self, failed: list) -> list:
        """Failed trainers an async job can do without (``min_trainers``); logged once each."""
        if not self.min_trainers:
            return []
        dead_trainers = [p for p in self.trainers if p.poll() not in (None, 0)]
        if any(p not in self.trainers for p in failed) or len(self.trainers) - len(dead_trainers) < self.min_trainers:
            return []
        for p in dead_trainers:
            if p not in self._tolerated_seen:
                self._tolerated_seen.append(p)
                log.warning("%s; async training continues with %d trainers (--min-trainers %d)", p.describe_exit(),
                            len(self.trainers) - len(dead_trainers), self.min_trainers)
        return dead_trainers

    def _server_states(self, now: float) -> list[ServerState]:
        """Each server as launch/peer_loss.py sees it: exit code, the peers its last status
        line names, and how long ago that line came."""
        states = []
        for i, p in enumerate(self.servers):
            status, at = getattr(p, "last_status", lambda: (None, None))()
            states.append(ServerState(i, p.poll(), dict(status.unreachable) if status else {},
                                      status.gone if status else (), None if at is None else now - at))
        return states

    def _peer_verdict(self) -> Verdict:
        """Which servers are hung, which died and which died only of a lost peer. A peer may
        still exit for a server restarted less than a timeout (plus its heartbeat) ago."""
        now = time.monotonic()
        window = (self.server_ranks[0].env.timeout if self.server_ranks else 120.0) + 10.0
        recent = [i for i, t in self._restarted_at.items() if now - t < window]
        verdict = decide(self._server_states(now), recent)
        for i, why in verdict.spared.items():
            key = (i, getattr(self.servers[i], "pid", 0))
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

    def _kill_hung(self, verdict: Verdict) -> dict:
        """SIGKILL the hung servers (a hung process runs no SIGTERM handler); process -> why."""
        hung = {self.servers[i]: why for i, why in verdict.hung.items()}
        for p, why in hung.items():
            log.error("%s (%s) is %s: killing it (SIGKILL)", p.tag, where(p), why)
            kill = getattr(p, "kill", None)
            if kill is not None:
                kill()
            else:
                self.engine.stop([p], 0.0, None)
        return hung

    def _restart_in_place(self, failed: list, verdict: Verdict) -> bool:
        """Dead or hung servers only, restarts left, a checkpoint to roll back to: kill the hung
        ones, start each again on its own address; the trainers wait for them and roll back
        (client/recovery.py). One restart per root cause: a server that exited only because a
        hung or dead peer did comes back with it for free (launch/peer_loss.py)."""
        if not (failed or verdict.hung) or any(p not in self.servers for p in failed) \
                or self.restarts_left < verdict.cost:
            return False
        from ..checkpoint.format import checkpoints
        done = checkpoints(self.checkpoint_dir) if self.checkpoint_dir else []
        if not done:
            if failed:      # a hung one alone: the peers' own timeout ends the job, naming it
                log.error("no checkpoint in %s yet: a dead server cannot be restarted in place", self.checkpoint_dir)
            return False
        old = list(self.servers)
        hung = self._kill_hung(verdict)
        first = self.restarts_used + 1
        self.restarts_left -= verdict.cost
        self.restarts_used += verdict.cost
        causes = []
        for i in verdict.restart:
            p, rank = old[i], self.server_ranks[i]
            if p in hung:
                what, causes = f"{p.tag} was hung and is killed", causes + [f"{rank.name} ({hung[p]})"]
            elif i in verdict.casualties:
                what = f"{p.describe_exit()}: it lost a peer server, so no restart is spent on it"
            else:
                what, causes = p.describe_exit(), causes + [f"{rank.name} ({exit_reason(p)})"]
            log.warning("%s; restarting it in place on %s (restart %d); the trainers roll back to the "
                        "latest checkpoint (%s)", what, rank.env.servers[i], first if i in verdict.casualties
                        else self.restarts_used, done[-1].name)
            self.servers[i] = self.engine.start(dataclasses.replace(
                rank, env=dataclasses.replace(rank.env, recovering=True)))
            self._restarted_at[i] = time.monotonic()
        spent = (f"restart {first}" if verdict.cost == 1 else f"restarts {first}-{self.restarts_used}"
                 if verdict.cost else "no restart spent")
        self.incidents.append(f"{spent}: " + ", ".join(causes or ["servers that lost a just restarted peer"]))
        return True

    def wait(self, poll_interval: float = 0.1) -> int:
        """Block until the job ends; 0 when every trainer succeeded (or, with ``min_trainers``,
        enough of them), else the first failure's code."""
        try:
            while True:
                everyone = self.servers + self.trainers
                failed = [p for p in everyone if p.poll() not in (None, 0)]
                tolerated = self._tolerated(failed)
                failed = [p for p in failed if p not in tolerated]
                verdict = self._peer_verdict()
                if (failed or verdict.hung) and self._restart_in_place(failed, verdict):
                    continue
                if failed:
                    for p in failed:
                        log.error("%s", p.describe_exit())
                    if not verdict.hung and all(lost_a_peer(p) for p in failed):
                        verdict = self._await_hung()
                    # A hung server some peer exited for is the root cause, not the ones that gave up on it.
                    hung = self._kill_hung(verdict)
                    failed = [*hung, *failed]
                    first = next(iter(hung)) if hung else first_failure(failed)
                    log.error("stopping the job: %s failed", first.tag)
                    stopping_at = time.monotonic()
                    # What the others print as they are stopped is not news.
                    _each([p for p in everyone if p not in failed], "hold_tracebacks")
                    self.close()
                    late = [p for p in everyone if p not in failed and p.poll() not in (None, 0)]
                    for p in late:
                        log.info("then: %s", p.describe_exit())
                    # Failed on their own: exited, or reported an error, before the launcher stopped them.
                    ended = {p: getattr(p, "ended_at", None) or float("inf") for p in late}
                    late = [p for p in late if ended[p] < stopping_at or _failed_at(p) < stopping_at]
                    _each(everyone, "mute")        # nothing after the summary
                    log.error("%s", failure_summary(first, [p for p in failed if p is not first] + late,
                                                    stopped=[p for p in late if ended[p] >= stopping_at and
                                                             p.poll() in (-signal.SIGTERM, -signal.SIGKILL)],
                                                    why=hung.get(first)))
                    return exit_status(first.poll()) or 1
                if all(t.poll() == 0 or t in tolerated for t in self.trainers):
                    # Servers exit on their own once every trainer has left.
                    deadline = time.monotonic() + 10
                    while any(s.poll() is None for s in self.servers) and time.monotonic() < deadline:
                        time.sleep(poll_interval)
                    self.close()
                    log.info("job finished: %d trainers succeeded", len(self.trainers) - len(tolerated))
                    for incident in self.incidents:
                        log.info("restarted in place: %s", incident)
                    return 0
                time.sleep(poll_interval)
        except (KeyboardInterrupt, StopSignal) as exc:
            return self.stop_on_signal(signal_number(exc))

    def stop_on_signal(self, signum: int) -> int:
        """Stop every process of the job after ``signum``; return the exit status, 128 + signum."""
        self.stopped_by_signal = True
        log.warning("%s received: stopping every process of the job", signal.Signals(signum).name)
        everyone = self.servers + self.trainers
        # Tracebacks of processes dying of the stop (KeyboardInterrupt, peers lost) are noise.
        _each(everyone, "hold_tracebacks")
        hurry = threading.Event()
        with _signals_hurry(hurry):
            self.close(hurry=hurry)
        _each(everyone, "mute")
        for p in everyone:
            withheld = getattr(p, "withheld", None)
            if withheld:
                log.info("%s: stopped; its traceback is not shown (%s)", p.tag, withheld[-1])
        return 128 + signum

    def close(self, grace: float = 5.0, hurry: threading.Event | None = None) -> None:
        # Trainers first, so servers do not log lost clients needlessly; each
        # group is stopped together, so this takes two grace periods at most.
        self.engine.stop(self.trainers, grace, hurry)
        self.engine.stop(self.servers, grace, hurry)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
