"""Run a job on many machines over SSH (the system ``ssh`` client).

The system client is used on purpose: it honours the user's ``~/.ssh/config``,
agents, ProxyJump and ControlMaster; ``--ssh-config`` is passed as ``ssh -F``.
Every rank is one ``ssh -T host 'cd WS && exec setsid --wait sh -c WRAPPER ...'``
whose output streams back tagged ``host | server 0 |``.

No orphans: SSH does not pass signals on for root logins, and killing the
client of a session without a pty leaves the remote command running. So the
channel's stdin stays open for the rank's lifetime, and the wrapper (the
leader of a new session on the remote host) runs a watcher that kills the
whole remote process group when stdin reaches EOF: the launcher stopped the
ssh client, or was killed itself, or the connection dropped. The same channel
carries a ``leave`` line, the wrapper's SIGUSR1 to an elastic job's trainer.

Environment goes inline (``env K=V ... CMD``, no ``SendEnv``, which needs
``AcceptEnv`` on every server), except ``PARAMSHARD_SECRET``, which is the
first line of the channel's stdin so it never shows on a command line.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import re
import shlex
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable, Sequence, TextIO

from paramshard.errors import ConfigError
from paramshard.log import get_logger
from paramshard.launch.api import JobSpec, LaunchConfig, RankSpec, thread_environ
from paramshard.launch.engines.hosts import Host, placement
from paramshard.launch.engines.placement import TapFor
from paramshard.launch.engines.processes import Child, stop_all

log = get_logger("launch")

# $1: read-secret|no-secret, $2...: the command. Reads the secret from the first
# line of stdin when asked, then keeps the channel's stdin on fd 3 for the
# watcher; background jobs get /dev/null as stdin, hence the duplicate. The
# watcher ignores TERM so it can escalate to KILL after its group got TERM. A
# line "leave" on the channel asks the command to leave (SIGUSR1: an elastic
# job's trainer leaves at its next step boundary, trainer/leave_request.py).
WRAPPER = r"""
if [ "$1" = read-secret ]; then IFS= read -r PARAMSHARD_SECRET; export PARAMSHARD_SECRET; fi
shift
exec 3<&0
"$@" 0</dev/null 3<&- &
child=$!
{ trap '' TERM; while IFS= read -r line <&3; do if [ "$line" = leave ]; then kill -s USR1 "$child" 2>/dev/null; fi; done; kill -s TERM -- -$$ 2>/dev/null; sleep 5; kill -s KILL -- -$$ 2>/dev/null; } 0</dev/null >/dev/null 2>&1 &
watcher=$!
exec 3<&-
wait "$child"; code=$?
kill -s KILL "$watcher" 2>/dev/null
exit "$code"
"""
SSH_UNREACHABLE = 255     # what ssh exits with when it cannot connect or loses the connection


@dataclasses.dataclass(frozen=True)
class SshOptions:
    ssh_config: str | None = None
    remote_python: str = sys.executable
    workspace: str | None = None          # remote directory to run in (None: this one's path)
    dispatch_package: str | None = None   # local directory copied to the workspace first
    connect_timeout: float = 10.0

    def ssh_argv(self, host: Host) -> list[str]:
        """``ssh`` up to (not including) the target: shared by ranks, probes and rsync.
        Callers put ``--`` before the target (rsync cannot: it adds ``-l USER`` after these words)."""
        argv = ["ssh", "-T", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={self.connect_timeout:g}",
                # A silent partition ends the client (exit 255) within ~6 s, so the job fails fast.
                "-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3"]
        if self.ssh_config:
            argv += ["-F", self.ssh_config]
        if host.port:
            argv += ["-p", str(host.port)]
        return argv


def remote_dir(path: str) -> str:
    """A remote path for a shell command line: ``~/`` stays unquoted so the remote shell expands it."""
    if path == "~":
        return "~"
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:])
    return shlex.quote(path)


def host_of(rank: RankSpec) -> str:
    """The host an SSH job's rank runs on: every one has its own (JobSpec.build's server_hosts and
    trainer_hosts, SshPlacement.place_rank)."""
    assert rank.host is not None, f"{rank.name}: a rank of an SSH job without its host"
    return rank.host


def remote_command(rank: RankSpec, workdir: str, read_secret: bool) -> str:
    env = rank.environ()
    env.pop("PARAMSHARD_SECRET", None)
    assignments = [f"{k}={v}" for k, v in sorted(env.items())]
    inner = ["read-secret" if read_secret else "no-secret", "env", *assignments, *rank.argv]
    return (f"cd {remote_dir(workdir)} && exec setsid --wait sh -c {shlex.quote(WRAPPER)} "
            f"paramshard-rank {shlex.join(inner)}")


class RemoteChild(Child):
    def __init__(self, host: Host, *args, **kwargs):
        self.host = host
        super().__init__(*args, **kwargs)

    def describe_exit(self) -> str:
        if self.proc.returncode == SSH_UNREACHABLE:
            return (f"{self.tag}: ssh to {self.host.target} failed or lost its connection (exit 255): "
                    f"host down, network cut, or ssh refused; see the lines above")
        return super().describe_exit()


class SshEngine:
    """Ranks on other hosts over ssh (Engine contract, launch/engines/process.py)."""

    def __init__(self, hosts: dict[str, Host], options: SshOptions, workdir: str, secret: str | None, out=None,
                 tap_for: TapFor | None = None):
        self.hosts, self.options, self.workdir, self.secret = hosts, options, workdir, secret
        self.out = out or sys.stdout
        self.tap_for = tap_for       # rank -> Child tap (observe/run_records/run_dir.py): `paramshard launch`'s

    def start(self, rank: RankSpec) -> RemoteChild:
        host = self.hosts[host_of(rank)]
        argv = [*self.options.ssh_argv(host), "--", host.target,
                remote_command(rank, self.workdir, read_secret=bool(self.secret))]
        stdin = f"{self.secret}\n" if self.secret else ""
        return RemoteChild(host, rank.tag, argv, dict(os.environ), self.out, stdin_text=stdin,
                           tap=self.tap_for(rank) if self.tap_for else None)

    def stop(self, processes: Sequence[Child], grace: float, hurry: threading.Event | None) -> None:
        stop_all(processes, grace, hurry)

    @staticmethod
    def ask_to_leave(process: Child) -> None:
        """An elastic job's trainer leaves at its next step boundary: the rank's wrapper turns a
        ``leave`` line on the channel's stdin into SIGUSR1 (WRAPPER)."""
        stdin = process.proc.stdin
        if stdin is None or process.poll() is not None:
            return
        try:
            stdin.write("leave\n")
            stdin.flush()
        except OSError:
            pass            # it exited meanwhile: the loop sees how


def _run(argv: list[str], timeout: float, what: str) -> str:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{what}: no answer within {timeout:g} s (host down or unreachable?)") from None
    except FileNotFoundError as exc:
        raise ConfigError(f"{what}: {exc.filename} is not installed") from None
    if r.returncode != 0:
        tail = (r.stderr.strip() or r.stdout.strip()).splitlines()[-3:]
        raise ConfigError(f"{what} failed (exit {r.returncode}): {' / '.join(tail) or 'no output'}")
    return r.stdout


# Prints the file system's identity (machine id, boot id, and the root directory's
# device: hosts with the same one share a file system, so one copy of the workspace
# serves them all; containers on one machine differ by their root), the CPUs a
# process may use there, then free ports on the given address.
_PROBE = ("import os,socket,sys\n"
          "ident=''\n"
          "for f in ('/etc/machine-id','/proc/sys/kernel/random/boot_id'):\n"
          "    try: ident+=open(f).read().strip()\n"
          "    except OSError: pass\n"
          "st=os.stat('/'); ident+=f':{st.st_dev}:{st.st_ino}'\n"
          "try: cpus=len(os.sched_getaffinity(0))\n"
          "except AttributeError: cpus=os.cpu_count() or 1\n"
          "socks=[socket.socket() for _ in range(int(sys.argv[2]))]\n"
          "[s.bind((sys.argv[1], 0)) for s in socks]\n"
          "print(ident or 'unknown', cpus, *[s.getsockname()[1] for s in socks])")


@dataclasses.dataclass(frozen=True)
class Probed:
    machine: str          # hosts with the same one share a machine (and a file system)
    cpus: int             # CPUs a process may use there
    ports: list[int]      # free right now on the host's own address


def probe(host: Host, ports: int, options: SshOptions) -> Probed:
    """What the job needs to know of ``host``, with ``ports`` free ports, asked on that
    host; this also checks ssh and the remote Python before anything starts."""
    argv = [*options.ssh_argv(host), "--", host.target,
            shlex.join([options.remote_python, "-c", _PROBE, host.address, str(ports)])]
    out = _run(argv, options.connect_timeout + 10, f"ssh to {host.target}")
    words = out.split()
    try:
        numbers = [int(p) for p in words[1:]]
    except ValueError:
        numbers = []
    if len(numbers) != ports + 1:
        raise ConfigError(f"ssh to {host.target}: unexpected answer {out.strip()[:200]!r} from the probe "
                          f"(is {options.remote_python} a Python on that host? set --remote-python)")
    return Probed(words[0], numbers[0], numbers[1:])


def dispatch(host: Host, package: str, workspace: str, options: SshOptions) -> int:
    """Copy ``package`` to ``workspace`` on ``host`` (incremental: rsync sends only
    what changed); returns how many files were sent."""
    src = os.path.join(os.path.abspath(package), "")
    # "--": no operand is an option to rsync. rsync itself runs `SSH [-l USER] HOST ...`, so
    # the host and user reach ssh unguarded there: Host refuses any that start with "-".
    argv = ["rsync", "-az", "--delete", "--mkpath", "--stats", "-e", shlex.join(options.ssh_argv(host)), "--",
            src, f"{host.target}:{workspace}/"]
    out = _run(argv, 600, f"copying {package} to {host.target}:{workspace}")
    sent = re.search(r"Number of regular files transferred: ([\d,]+)", out)
    count = int(sent.group(1).replace(",", "")) if sent else -1
    log.info("%s: %s files of %s sent to %s", host.target, count if count >= 0 else "?", package, workspace)
    return count


def with_own_hosts(spec: JobSpec, addresses: dict[str, str]) -> JobSpec:
    """Every rank told its own host's address (PARAMSHARD_HOST): a trainer serves /metrics
    there, not on every interface of a machine other users may share."""
    def own(rank: RankSpec) -> RankSpec:
        return dataclasses.replace(rank, env=dataclasses.replace(rank.env, host=addresses[host_of(rank)]))
    return JobSpec(tuple(map(own, spec.servers)), tuple(map(own, spec.trainers)))


def threads_by_host(placed: Sequence[Host], found: dict[str, Probed]) -> dict[str | None, dict[str, str]]:
    """Host -> its ranks' thread variables: its CPUs shared by every rank ``placed`` on its machine
    (hosts that are one machine, e.g. loopback aliases, count together)."""
    on_machine = collections.Counter(found[h.target].machine for h in placed)
    return {h.host: thread_environ(found[h.target].cpus, on_machine[found[h.target].machine]) for h in placed}


class SshHosts:
    """An SSH job's placement (Placement contract, launch/engines/placement.py): servers one per host
    first, then trainers on the least loaded hosts; at start every host probed and the workspace
    copied; ranks started mid-job and hosts added or removed while it runs: ssh_placement.py."""
    on_hosts = True

    def __init__(self, config: LaunchConfig, hosts: list[Host], options: SshOptions,
                 server_hosts: list[Host] | None = None, trainer_hosts: list[Host] | None = None):
        if config.fork:
            raise ConfigError("--fork forks ranks on this machine; an SSH job starts them on other hosts: drop --fork")
        self.config, self.options = config, options
        self.on_servers, self.on_trainers = placement(config.servers, config.trainers, hosts,
                                                      server_hosts, trainer_hosts)
        # The engine's hosts: one dict, shared with the engine and the mid-job placement (a host added
        # while the job runs goes in, so ranks can start there).
        self.all_hosts = {h.host: h for h in [*hosts, *(server_hosts or []), *(trainer_hosts or [])]}
        self.job_hosts = (hosts, server_hosts, trainer_hosts)     # as given: ssh_placement.py's pools
        if options.dispatch_package:
            if not os.path.isdir(options.dispatch_package):
                raise ConfigError(f"--dispatch-package {options.dispatch_package!r} is not a directory")
            self.workdir = options.workspace or f"~/.paramshard/{config.job_id}"
        else:
            self.workdir = options.workspace or os.getcwd()
        self.script = self._remote_script()
        self.mid_job = None           # ssh_placement.SshPlacement, once the hosts were probed (job_spec)
        self.used: dict[str, Host] = {}

    def engine(self, out: TextIO | None, tap_for: TapFor | None) -> SshEngine:
        return SshEngine(self.all_hosts, self.options, self.workdir, self.config.secret, out, tap_for)

    def _remote_script(self) -> str | None:
        """The script's path as the remote side sees it, from the workspace (None: a module,
        which python -m finds from the workspace or the hosts' own installation)."""
        package = self.options.dispatch_package
        if not package or self.config.script is None:
            return self.config.script
        local = os.path.abspath(self.config.script)
        root = os.path.abspath(package)
        if os.path.commonpath([local, root]) != root:
            raise ConfigError(f"training script {self.config.script!r} is not inside --dispatch-package "
                              f"{package!r}: only that directory is copied to the hosts")
        return os.path.relpath(local, root)

    def job_spec(self, running: Callable[[], list[RankSpec]], record: Callable[..., None]) -> JobSpec:
        used = self.used = {h.target: h for h in [*self.on_servers, *self.on_trainers]}
        servers_on: dict[str, list[int]] = {t: [] for t in used}
        for i, h in enumerate(self.on_servers):
            servers_on[h.target].append(i)
        # Collective and hybrid modes: one more port on trainer 0's host, for the trainers' store.
        store_host = self.on_trainers[0] if self.config.collective else None
        extra = {t: int(store_host is not None and t == store_host.target) for t in used}
        with ThreadPoolExecutor(max_workers=min(16, len(used))) as pool:
            found = dict(zip(used, pool.map(lambda t: probe(used[t], len(servers_on[t]) + extra[t], self.options),
                                            used)))
            package = self.options.dispatch_package
            if package:
                # One copy per machine: hosts that share one (loopback aliases, network
                # namespaces) would otherwise race their rsyncs into the same directory.
                machines = {p.machine: used[t] for t, p in found.items()}
                list(pool.map(lambda h: dispatch(h, package, self.workdir, self.options),
                              machines.values()))
        addresses = [""] * self.config.servers
        for target, servers in servers_on.items():
            for i, port in zip(servers, found[target].ports):
                addresses[i] = f"{self.on_servers[i].address}:{port}"
        collective_addr = (f"{store_host.address}:{found[store_host.target].ports[-1]}"
                           if store_host is not None else None)
        spec = JobSpec.build(self.config, addresses, python=self.options.remote_python,
                             collective_addr=collective_addr,
                             server_hosts=[h.host for h in self.on_servers],
                             trainer_hosts=[h.host for h in self.on_trainers], script=self.script,
                             threads=threads_by_host([*self.on_servers, *self.on_trainers], found))
        self.mid_job = self._mid_job(found, running, record)
        return with_own_hosts(spec, {h.host: h.address for h in [*self.on_servers, *self.on_trainers]})

    def _mid_job(self, found: dict[str, Probed], running: Callable[[], list[RankSpec]], record):
        """Ranks started mid-job (scale, replacements) and hosts added while it runs: ssh_placement.py."""
        from paramshard.launch.engines.ssh_placement import SshPlacement
        package = self.options.dispatch_package
        return SshPlacement(
            *self.job_hosts, engine_hosts=self.all_hosts,
            machines={p.machine for p in found.values()},
            # Where each live rank runs (its ssh target), as the engine started it.
            live_hosts=lambda: [self.all_hosts[host_of(rank)].target for rank in running()],
            probe=lambda host, ports: probe(host, ports, self.options),
            dispatch=(lambda host: dispatch(host, package, self.workdir, self.options)) if package else None,
            record=record)

    def describe(self, spec: JobSpec) -> str:
        addresses = spec.servers[0].env.servers if spec.servers else ()
        return (f"started {self.config.servers} servers ({','.join(addresses)}) and {self.config.trainers} "
                f"trainers on {len(self.used)} hosts")

    def _started(self):
        if self.mid_job is None:
            raise ConfigError("the SSH job has not started: its hosts are placed once they were probed")
        return self.mid_job

    def new_server_address(self, host: str | None = None) -> str:
        return self._started().new_server_address(host)

    def place_rank(self, rank: RankSpec) -> RankSpec:
        return self._started().place_rank(rank)

    def add_host(self, text: str) -> str:
        return self._started().add_host(text)

    def find(self, text: str) -> Host:
        return self._started().find(text)

    def remove_host(self, host: Host) -> None:
        self._started().remove_host(host)


if TYPE_CHECKING:   # `make typecheck` checks the contracts: Process, Engine (process.py), Placement (placement.py)
    from paramshard.launch.engines.placement import Placement
    from paramshard.launch.engines.process import Engine, Process
    _process: type[Process] = RemoteChild
    _engine: type[Engine[Child]] = SshEngine
    _placement: type[Placement] = SshHosts
