"""A throwaway one-node Slurm cluster (munged + slurmctld + slurmd) for testing a Slurm engine.

    with SlurmCluster() as cluster:                     # or the `slurm_cluster` fixture
        subprocess.run(cluster.srun_argv(4, "hostname"), env=cluster.environ(), check=True)
        cluster.scontrol("show", "node")

Everything lives in a temporary directory: the munge key, socket and seed, ``slurm.conf``
(``SlurmUser=root``, ``SlurmdUser=root``, ``AuthInfo=socket=<our munged>``,
``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``, ``MpiDefault=none``,
``select/cons_tres`` with ``CR_CPU``, ``SlurmdParameters=config_overrides`` so the node may
declare more CPUs than the machine has, state, spool, pid and log files), all three daemons
run in the foreground under this process (``munged -F``, ``slurmctld -D -i``,
``slurmd -D -N <node>``), as root, on free ports on 127.0.0.1 only
(``CommunicationParameters=NoInAddrAny,NoCtldInAddrAny``: slurmctld, slurmd and srun bind the
address the host name resolves to instead of 0.0.0.0; on this machine ``vm`` -> 127.0.0.1).
Nothing is written to /etc, /var or /run. Every client command must see
``SLURM_CONF=<workdir>/slurm.conf``: use :meth:`SlurmCluster.environ` (it also drops any
SLURM_*/SRUN_*/SALLOC_*/SBATCH_* variables inherited from an outer Slurm job, which would make
srun try to join that job). ``close()`` cancels the jobs, stops the job steps (slurmstepd and
the tasks under it), slurmd, slurmctld and munged by PID (TERM, wait, KILL), and removes the
directory if it made it. Start-up takes about 0.2 s here (slurm_problem()'s one trial
cluster 0.3 s), close() 0.1 s (up to KillWait=2 s more while a job step is still running).

Host-name independence: ``SlurmctldHost=localhost(127.0.0.1)`` (slurmctld accepts
"localhost" as its own name whatever the host is called), ``slurmd -N psnode`` with
``NodeAddr=127.0.0.1``. NoInAddrAny binds the address the *host name* resolves to; where that
is not a loopback address (or does not resolve), the daemons and srun (``srun_argv``) run in a
UTS namespace whose host name is "localhost" (``unshare --uts``), so tasks then see
``hostname`` = localhost. munged wants every directory above its socket to be o+x: with a
workdir under pytest's tmp_path (/tmp/pytest-of-root is 0700) the socket goes to its own
/tmp/paramshard-munge-* directory. One node: while a finished job is still COMPLETING (up to
KillWait), a new srun may print "queued and waiting for resources" and start 2-5 s later.

What a task started by ``srun -n 2`` sees (Slurm 22.05.8, Debian 12; task 1 of job 2)::

    SLURM_PROCID=1              global rank            SLURM_NTASKS=2 (= SLURM_NPROCS)
    SLURM_LOCALID=1             rank on this node      SLURM_NODEID=0 (node index in the step)
    SLURM_JOB_ID=2 (= SLURM_JOBID)                     SLURM_STEP_ID=0 (= SLURM_STEPID)
    SLURMD_NODENAME=psnode      the node it runs on (the NodeName, not the host name)
    SLURM_JOB_NODELIST=psnode   SLURM_STEP_NODELIST=psnode   SLURM_NODELIST=psnode
    SLURM_JOB_NUM_NODES=1  SLURM_NNODES=1  SLURM_STEP_NUM_NODES=1  SLURM_STEP_NUM_TASKS=2
    SLURM_TASKS_PER_NODE=2  SLURM_STEP_TASKS_PER_NODE=2  SLURM_CPUS_ON_NODE=2  SLURM_GTIDS=0,1
    SLURM_LAUNCH_NODE_IPADDR=127.0.0.1   address of the host srun runs on
    SLURM_SRUN_COMM_HOST=127.0.0.1  SLURM_SRUN_COMM_PORT=45087  SLURM_STEP_LAUNCHER_PORT=45087
    SLURM_SUBMIT_HOST=vm  SLURM_SUBMIT_DIR=<cwd of srun>  SLURM_CLUSTER_NAME=paramshard
    SLURM_TOPOLOGY_ADDR=psnode  SLURM_TASK_PID=9953  SLURM_JOB_PARTITION=debug
    SLURM_WORKING_CLUSTER=paramshard:127.0.0.1:46817:9728:109  (ctld address:port)
    SLURM_CONF=<workdir>/slurm.conf (inherited from srun's environment, as is the rest of it)

No variable holds the node's *address*: it is the node's ``NodeAddr`` (127.0.0.1 here), which
``scontrol show node $SLURMD_NODENAME`` prints (``NodeAddr=127.0.0.1``); the whole
environment of srun is passed on to the tasks, so a launcher may also export its own
variables (``srun --export=ALL,VAR=value``).

``srun --kill-on-bad-exit=1`` (``-K1``) when one task exits 1: srun reports
``task 1: Exited with exit code 1``, signals the step (``STEP n.0 ... CANCELLED``), the other
tasks get SIGTERM about 0.1-0.3 s later (SIGKILL after ``KillWait=2`` s if they are still
there), and srun exits about 0.3 s after the failure with status 143 (the largest task status:
128+SIGTERM for the killed tasks; 1 when nothing else was killed). Without ``-K`` (the
default ``KillOnBadExit=0``) srun waits for the other tasks and exits 1.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pytest

from tests.engines import alive, process_tree, stop_processes, stop_tree, unavailable

SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])
INSTALL_HINT = ("install Slurm and munge with `sudo scripts/install-test-engines.sh` (packages slurm-wlm, munge) "
                "and run the tests as root")
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("srun", "scontrol", "sinfo", "squeue", "scancel")
# Variables of an outer Slurm job that would make srun/sinfo talk about that job instead.
_OUTER_PREFIXES = ("SLURM_", "SLURMD_", "SRUN_", "SALLOC_", "SBATCH_", "SQUEUE_", "SINFO_", "SCONTROL_")


def which(name: str) -> str | None:
    return shutil.which(name, path=SBIN_PATH)


def _unavailable(reason: str) -> None:
    unavailable(reason, INSTALL_HINT)


_checked: list[str | None] = []


def _static_problem() -> str | None:
    if os.geteuid() != 0:
        return "the Slurm engine tests need root (slurmd and slurmctld run as root, SlurmUser=root)"
    missing = [b for b in (*DAEMONS, *CLIENTS) if which(b) is None]
    if missing:
        return f"missing {', '.join(missing)} (packages slurm-wlm and munge)"
    return None


def slurm_problem() -> str | None:
    """Why a Slurm test cluster cannot run here, or None. Beyond root and the programs, the
    first call starts a cluster once and runs ``srun -n 1 true`` on it (about 0.5 s): if that
    fails, the answer says what failed, with the last lines of the daemons' logs."""
    if not _checked:
        problem = _static_problem()
        if problem is None:
            try:
                with SlurmCluster(cpus=2) as cluster:
                    r = cluster.run(cluster.srun_argv(1, "true"), timeout=30)
                    if r.returncode != 0:
                        problem = (f"`srun -n 1 true` failed on the test cluster (exit {r.returncode}): "
                                   f"{r.stderr.strip()[-2000:]}\n{cluster.logs()}")
            except SlurmStartError as exc:
                problem = f"the Slurm test cluster did not start: {exc}"
            except subprocess.TimeoutExpired:
                problem = "`srun -n 1 true` did not finish within 30 s on the test cluster"
        _checked.append(problem)
    return _checked[0]


def require_slurm() -> None:
    """Skip the calling test unless root, munged/slurmctld/slurmd/srun/... are installed and
    a test cluster runs a job (see :func:`slurm_problem`).

    The skip message says why and how to install; with ``PARAMSHARD_REQUIRE_ENGINES=1`` it fails.
    """
    problem = slurm_problem()
    if problem:
        _unavailable(problem)


class SlurmStartError(RuntimeError):
    pass


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def _free_ports(n: int, address: str = "127.0.0.1") -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((address, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _traversable_by_all(path: Path) -> bool:
    """munged insists that every directory above its socket is executable by everybody."""
    for p in [path, *path.parents]:
        try:
            if not os.stat(p).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    return True


def _environ_without_outer_slurm(base: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in base.items() if not k.startswith(_OUTER_PREFIXES)}


class SlurmCluster:
    """munged, slurmctld and one slurmd, configured and run from a temporary directory.

    Args:
        cpus: CPUs the node declares (more than the machine has is fine: config_overrides).
        node_name: the node's NodeName (slurmd runs with ``-N node_name``).
        workdir: where configs, state, spool and logs go (default: a new temporary
            directory, removed by close() unless starting failed).
        start_timeout: seconds for the node to become idle in ``sinfo``.
        extra_conf: lines appended to slurm.conf.
    """

    def __init__(self, cpus: int = 16, *, node_name: str = "psnode", cluster_name: str = "paramshard",
                 workdir: str | os.PathLike | None = None, start_timeout: float = 30.0, extra_conf: str = ""):
        if _static_problem():
            raise SlurmStartError(f"{_static_problem()}; {INSTALL_HINT}")
        # With NoInAddrAny the daemons and srun bind the address the host name resolves to.
        # If that is not a loopback address, they run in a UTS namespace named "localhost".
        self.uts_wrapper: list[str] = []
        if not _hostname_is_loopback():
            if which("unshare") is None or which("hostname") is None:
                raise SlurmStartError(f"the host name {socket.gethostname()!r} does not resolve to a loopback "
                                      "address and unshare (util-linux) or hostname is missing")
            self.uts_wrapper = [which("unshare"), "--uts", "sh", "-c", 'hostname localhost && exec "$0" "$@"']
        self.cpus = cpus
        self.node_name = node_name
        self.cluster_name = cluster_name
        self.start_timeout = start_timeout
        self.extra_conf = extra_conf
        self._own_workdir = workdir is None
        if workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="paramshard-slurm-"))
            os.chmod(self.workdir, 0o755)
        else:
            self.workdir = Path(workdir)
            self.workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = self.workdir.resolve()
        # munged's socket: in the work directory if every directory above it can be traversed
        # by all (pytest's tmp_path cannot: /tmp/pytest-of-root is 0700) and the path is short.
        munge_dir = self.workdir / "munge"
        self._own_munge_dir = None
        if not _traversable_by_all(self.workdir) or len(str(munge_dir / "munge.socket")) > 100:
            munge_dir = Path(tempfile.mkdtemp(prefix="paramshard-munge-", dir="/tmp"))
            self._own_munge_dir = munge_dir
        munge_dir.mkdir(exist_ok=True)
        os.chmod(munge_dir, 0o755)
        self.munge_dir = munge_dir
        self.munge_socket = str(munge_dir / "munge.socket")
        self.conf_path = self.workdir / "slurm.conf"
        self.ctld_port = self.slurmd_port = 0
        # Job ids as a real cluster's (large, not 1, 2, ... in every test cluster): the Slurm store's
        # default port derives from the job id (launch/rank/rendezvous.py), so two test clusters'
        # first jobs would otherwise both want 29601 (one run failed on it: 'cannot host the slurm
        # store'); a holder from an earlier cluster or another worker then fails a job by chance.
        self.first_job_id = random.randrange(1000, 1_000_000)
        self.procs: dict[str, subprocess.Popen] = {}
        self._closed = False
        self.env = {"SLURM_CONF": str(self.conf_path)}
        self.startup_seconds: float | None = None
        t0 = time.monotonic()
        try:
            self._start()
        except BaseException:
            self._own_workdir = False  # keep the logs the error points at
            self.close()
            raise
        self.startup_seconds = time.monotonic() - t0

    # -- environment and commands ---------------------------------------------------------
    def environ(self, base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
        """A full environment for a client command (srun, sinfo, ...): ``base`` (default
        os.environ) without an outer job's SLURM_* variables, plus SLURM_CONF and ``extra``."""
        env = _environ_without_outer_slurm(os.environ if base is None else base)
        env.update(self.env)
        env.update(extra)
        return env

    def srun_argv(self, n: int, *command: str, extra: Iterable[str] = ()) -> list[str]:
        """``srun --ntasks=n [extra...] command...``; run it with ``env=cluster.environ()``."""
        return [*self.uts_wrapper, which("srun") or "srun", f"--ntasks={n}", *extra, *command]

    def run(self, argv: Sequence[str], timeout: float = 30.0, check: bool = False, **kwargs) -> subprocess.CompletedProcess:
        """Run a client command with this cluster's environment; output captured as text."""
        kwargs.setdefault("env", self.environ())
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(list(argv), timeout=timeout, check=check, **kwargs)

    def scontrol(self, *args: str, timeout: float = 10.0, check: bool = True) -> subprocess.CompletedProcess:
        """``scontrol ARGS...`` against this cluster (output captured; raises on failure by default)."""
        return self.run([which("scontrol") or "scontrol", *args], timeout=timeout, check=check)

    def node_state(self) -> str:
        r = self.run([which("sinfo") or "sinfo", "-h", "-n", self.node_name, "-o", "%T"], timeout=10)
        return r.stdout.strip() if r.returncode == 0 else f"(sinfo failed: {r.stderr.strip()})"

    def log_path(self, daemon: str) -> Path:
        return self.workdir / f"{daemon}.log"

    def pids(self) -> dict[str, int]:
        """PIDs of the daemons that are running."""
        return {name: p.pid for name, p in self.procs.items() if p.poll() is None}

    def logs(self, lines: int = 25) -> str:
        return "\n".join(f"--- {self.log_path(d)} (last lines):\n{_tail(self.log_path(d), lines)}" for d in DAEMONS)

    # -- start --------------------------------------------------------------------------
    def _write_conf(self) -> None:
        w = self.workdir
        (w / "state").mkdir(exist_ok=True)
        (w / "spool").mkdir(exist_ok=True)
        (w / "plugstack.conf").write_text("")  # not /etc/slurm/plugstack.conf
        self.conf_path.write_text(f"""# paramshard test cluster (tests/engines/slurm.py)
ClusterName={self.cluster_name}
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={self.ctld_port}
SlurmdPort={self.slurmd_port}
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={w}/state
SlurmdSpoolDir={w}/spool
SlurmctldPidFile={w}/slurmctld.pid
SlurmdPidFile={w}/slurmd.pid
SlurmctldLogFile={self.log_path("slurmctld")}
SlurmdLogFile={self.log_path("slurmd")}
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={w}/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
FirstJobId={self.first_job_id}
KillWait=2
InactiveLimit=0
MinJobAge=10
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=5
TmpFS={w}
NodeName={self.node_name} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN
PartitionName=debug Nodes={self.node_name} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
{self.extra_conf}
""")

    def _spawn(self, name: str, argv: list[str]) -> None:
        setpriv = which("setpriv")
        if setpriv:  # the daemon gets SIGTERM if this process dies without close() (e.g. SIGKILL)
            argv = [setpriv, "--pdeathsig", "TERM", *argv]
        argv = [*self.uts_wrapper, *argv]  # (unshare and sh exec: the PID is the daemon's own)
        env = self.environ()
        with open(self.log_path(name), "ab") as log:
            self.procs[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                                env=env, cwd=self.workdir, start_new_session=True)

    def _check_alive(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is not None:
            raise SlurmStartError(f"{name} exited with code {proc.returncode} while the test cluster was starting "
                                  f"(work directory {self.workdir}); {self.log_path(name)}:\n"
                                  f"{_tail(self.log_path(name))}")

    def _wait(self, what: str, ready, names: Sequence[str], deadline: float) -> None:
        while True:
            for name in names:
                self._check_alive(name)
            if ready():
                return
            if time.monotonic() > deadline:
                raise SlurmStartError(f"{what} within {self.start_timeout} s (work directory {self.workdir}; "
                                      f"node state: {self.node_state() if 'slurmctld' in self.procs else '-'})\n"
                                      f"{self.logs()}")
            time.sleep(0.05)

    def _munge_ready(self) -> bool:
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(self.munge_socket)
                return True
            except OSError:
                return False

    def _start(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        key = self.munge_dir / "munge.key"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(128))
        m = self.munge_dir
        self._spawn("munged", [which("munged"), "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={key}", f"--pid-file={m}/munged.pid", f"--log-file={m}/munged.file.log",
                               f"--seed-file={m}/munged.seed", "--num-threads=4"])
        self._wait("munged did not create its socket", self._munge_ready, ["munged"], deadline)

        for attempt in range(3):  # free ports probed now may be taken by the time a daemon binds
            self.ctld_port, self.slurmd_port = _free_ports(2)
            self._write_conf()
            self._spawn("slurmctld", [which("slurmctld"), "-D", "-i", "-f", str(self.conf_path)])
            try:
                self._wait("slurmctld did not answer `scontrol ping`", self._ctld_up, ["slurmctld"], deadline)
                self._spawn("slurmd", [which("slurmd"), "-D", "-N", self.node_name, "-f", str(self.conf_path)])
                self._wait(f"node {self.node_name} did not become idle", self._node_idle, ["slurmd", "slurmctld"],
                           deadline)
                return
            except SlurmStartError as exc:
                if attempt == 2 or "Address already in use" not in str(exc) or time.monotonic() > deadline:
                    raise
                for name in ("slurmd", "slurmctld"):
                    if name in self.procs:
                        stop_tree(self.procs.pop(name), grace=3.0)
                shutil.rmtree(self.workdir / "state", ignore_errors=True)

    def _ctld_up(self) -> bool:
        r = self.run([which("scontrol"), "ping"], timeout=10)
        return r.returncode == 0 and "is UP" in r.stdout

    def _node_idle(self) -> bool:
        return self.node_state() == "idle"

    # -- stop ---------------------------------------------------------------------------
    def step_daemons(self) -> list[int]:
        """PIDs of this cluster's slurmstepd processes (slurmd starts them as orphans: they are
        found by their environment, which holds this cluster's SLURM_CONF)."""
        marker = f"SLURM_CONF={self.conf_path}".encode()
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                if Path(f"/proc/{name}/comm").read_text().strip() != "slurmstepd":
                    continue
                if marker in Path(f"/proc/{name}/environ").read_bytes().split(b"\0"):
                    found.append(int(name))
            except OSError:
                continue
        return found

    def close(self) -> None:
        """Cancel the jobs, stop the job steps and every daemon by PID; remove the work
        directory if this object made it (and starting did not fail)."""
        if self._closed:
            return
        self._closed = True
        ctld = self.procs.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            try:  # cancel whatever is still running (the tasks get SIGTERM, then SIGKILL)
                jobs = self.run([which("squeue") or "squeue", "-h", "-o", "%i"], timeout=5).stdout.split()
                if jobs:
                    self.run([which("scancel") or "scancel", *jobs], timeout=5)
                    deadline = time.monotonic() + 5
                    while self.step_daemons() and time.monotonic() < deadline:
                        time.sleep(0.05)
            except (subprocess.SubprocessError, OSError):
                pass
        for pid in self.step_daemons():  # steps that did not go: their tasks, then slurmstepd
            stop_processes(list(reversed(process_tree(pid))), grace=3.0)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is not None:
                _stop_daemon(proc, grace=5.0)
        if self._own_munge_dir is not None:
            shutil.rmtree(self._own_munge_dir, ignore_errors=True)
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "SlurmCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # a forgotten close() still stops the daemons
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


def _stop_daemon(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM to the daemon itself (slurmctld stops its slurmscriptd child on its own; that
    child ignores a SIGTERM of its own), wait up to ``grace`` s, then stop whatever of its
    process tree is left (TERM, then KILL), by PID."""
    if proc.poll() is not None:
        return
    tree = process_tree(proc.pid)
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    left = [(pid, st) for pid, st in tree if pid != proc.pid and alive(pid, st)]
    if left:
        stop_processes(left, grace=1.0)
    if proc.poll() is None:
        stop_tree(proc, grace=1.0)


def _hostname_is_loopback() -> bool:
    """Does this host's name resolve (IPv4) to a loopback address? Slurm's NoInAddrAny binds that."""
    try:
        return all(info[4][0].startswith("127.") for info in
                   socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET, socket.SOCK_STREAM))
    except OSError:
        return False


# -- pytest fixture (import it into a test module: `from tests.engines.slurm import slurm_cluster`) --

@pytest.fixture
def slurm_cluster(tmp_path):
    """A factory: ``slurm_cluster(**SlurmCluster kwargs) -> SlurmCluster``, closed after the test.

    Calls :func:`require_slurm` first; if the daemons cannot start, the test is skipped (failed
    with PARAMSHARD_REQUIRE_ENGINES=1) with what failed and the last lines of the daemon's log.
    """
    made: list[SlurmCluster] = []

    def make(**kwargs) -> SlurmCluster:
        require_slurm()
        kwargs.setdefault("workdir", tmp_path / f"slurm-{len(made)}")
        try:
            cluster = SlurmCluster(**kwargs)
        except SlurmStartError as exc:
            _unavailable(f"the Slurm test cluster did not start: {exc}")
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()
