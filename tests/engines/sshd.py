"""Throwaway sshd "hosts" for testing an SSH launch engine against a real sshd.

    with SshHosts() as hosts:                       # 127.0.0.2 and 127.0.0.3
        subprocess.run(["ssh", "-F", hosts.ssh_config, hosts.hosts[0], "true"], check=True)
        hosts.stop_host(1)                          # host 1 "crashes" (its sessions too)

    with NetnsLab(3) as lab, SshHosts.in_lab(lab) as hosts:   # one sshd per namespace
        lab.run(0, ["ssh", "-F", hosts.ssh_config, hosts.hosts[1], "hostname", "-I"])

One sshd per host, each with its own config, host key and log, all under one temporary
directory; one client key; an ssh client config (``.ssh_config``) with a ``Host`` entry per
host, matching both the host's name (``host0``...) and its address. Processes are stopped by
PID (and their descendants: sshd's per-connection children and the commands they run).
Needs root (sshd runs as root and logs in as root): see :func:`require_engines`.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.engines import process_tree, stop_tree, unavailable

DEFAULT_ADDRESSES = ("127.0.0.2", "127.0.0.3")
NETNS_PORT = 2222  # inside a fresh namespace nothing else listens
SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])


def which(name: str) -> str | None:
    return shutil.which(name, path=SBIN_PATH)


def _loopback_alias_usable(address: str) -> str | None:
    """None if a TCP listener can bind ``address`` and accept a connection on it; else why not."""
    try:
        with socket.socket() as srv:
            srv.bind((address, 0))
            srv.listen(1)
            with socket.create_connection(srv.getsockname(), timeout=2):
                pass
    except OSError as exc:
        return f"loopback alias {address} is not usable ({exc})"
    return None


_checked: dict[tuple, str | None] = {}


def engines_problem(addresses: Sequence[str] = DEFAULT_ADDRESSES) -> str | None:
    """Why the SSH engine tests cannot run here, or None."""
    key = tuple(addresses)
    if key not in _checked:
        problem = None
        if os.geteuid() != 0:
            problem = "the SSH engine tests need root (sshd runs as root and logs in as root)"
        else:
            missing = [b for b in ("sshd", "ssh", "ssh-keygen", "rsync") if which(b) is None]
            if missing:
                problem = f"missing {', '.join(missing)}"
            else:
                for address in addresses:
                    problem = _loopback_alias_usable(address)
                    if problem:
                        break
        _checked[key] = problem
    return _checked[key]


def require_engines(addresses: Sequence[str] = DEFAULT_ADDRESSES) -> None:
    """Skip the calling test unless root, sshd/ssh/ssh-keygen/rsync and the loopback aliases are there.

    The skip message says why and how to install (``scripts/install-test-engines.sh``). With
    ``PARAMSHARD_REQUIRE_ENGINES=1`` it fails instead of skipping.
    """
    problem = engines_problem(addresses)
    if problem:
        unavailable(problem)


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


class SshStartError(RuntimeError):
    pass


class SshHosts:
    """One sshd per address, a client key and an ssh client config; a context manager.

    Args:
        addresses: listen addresses, one host each (default 127.0.0.2 and 127.0.0.3).
        port: the port every sshd listens on; None: a free port per host in the root
            namespace (probed on that address), 2222 inside a namespace.
        netns: per host, the network namespace to run its sshd in (``ip netns exec``), or
            None for the root namespace; a single string applies to all hosts. Readiness
            checks of a namespaced host log in from inside that same namespace, so nothing
            is sent to a non-loopback address from the root namespace.
        names: the hosts' names in the client config (default host0, host1, ...).
        workdir: where keys, configs and logs go (default: a new temporary directory,
            removed by close() unless starting failed; a given one is left in place).
        start_timeout: seconds for each host to accept a real login.
        user: the login user written into the client config (root: sshd runs as root).
    """

    def __init__(self, addresses: Sequence[str] = DEFAULT_ADDRESSES, *, port: int | None = None,
                 netns: str | Sequence[str | None] | None = None, names: Sequence[str] | None = None,
                 workdir: str | os.PathLike | None = None, start_timeout: float = 15.0,
                 user: str = "root"):
        self.addresses = list(addresses)
        n = len(self.addresses)
        if isinstance(netns, str) or netns is None:
            netns = [netns] * n
        self.netns: list[str | None] = list(netns)
        if len(self.netns) != n:
            raise ValueError("netns must have one entry per address")
        self.hosts: list[str] = list(names) if names else [f"host{i}" for i in range(n)]
        if len(self.hosts) != n:
            raise ValueError("names must have one entry per address")
        self._fixed_port = port
        self.ports: list[int] = [0] * n
        self.user = user
        self.start_timeout = start_timeout
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="paramshard-sshd-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.sshd_bin = which("sshd")
        self.ssh_bin = which("ssh")
        if not self.sshd_bin or not self.ssh_bin or not which("ssh-keygen"):
            raise SshStartError("sshd, ssh and ssh-keygen are needed: run scripts/install-test-engines.sh as root")
        self.client_key = self.workdir / "id_ed25519"
        self.authorized_keys = self.workdir / "authorized_keys"
        self.ssh_config = str(self.workdir / "ssh_config")
        self.procs: list[subprocess.Popen | None] = [None] * n
        self._closed = False
        try:
            self._start()
        except BaseException:
            self._own_workdir = False  # keep the logs the error points at
            self.close()
            raise

    @classmethod
    def in_lab(cls, lab, **kwargs) -> "SshHosts":
        """One sshd in each of a :class:`tests.engines.netns.NetnsLab`'s host namespaces."""
        return cls(lab.addresses, netns=lab.namespaces, **kwargs)

    # -- paths and commands -----------------------------------------------------------
    def log_path(self, i: int) -> Path:
        return self.workdir / f"sshd{i}.log"

    def config_path(self, i: int) -> Path:
        return self.workdir / f"sshd{i}_config"

    @property
    def ssh(self) -> list[str]:
        """The argv prefix of an ssh client using this config: ``[ssh, -F, CONFIG]``."""
        return [self.ssh_bin, "-F", self.ssh_config]

    @property
    def rsync_rsh(self) -> str:
        """For ``rsync -e``: ``ssh -F CONFIG``."""
        return f"{shlex.quote(self.ssh_bin)} -F {shlex.quote(self.ssh_config)}"

    def pid(self, i: int) -> int | None:
        p = self.procs[i]
        return p.pid if p is not None and p.poll() is None else None

    # -- start --------------------------------------------------------------------------
    def _keygen(self, path: Path, comment: str) -> None:
        if not path.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                           check=True, capture_output=True, env={**os.environ, "PATH": SBIN_PATH})

    def _write_sshd_config(self, i: int) -> None:
        w = self.workdir
        self.config_path(i).write_text(
            f"""# paramshard test host {self.hosts[i]} ({self.addresses[i]})
ListenAddress {self.addresses[i]}
Port {self.ports[i]}
AddressFamily any
HostKey {w}/host{i}_ed25519
PidFile {w}/sshd{i}.pid
AuthorizedKeysFile {self.authorized_keys}
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
HostbasedAuthentication no
PermitUserEnvironment no
X11Forwarding no
PrintMotd no
PrintLastLog no
UseDNS no
MaxStartups 200:30:400
MaxSessions 50
LoginGraceTime 30
ClientAliveInterval 5
ClientAliveCountMax 3
LogLevel VERBOSE
Subsystem sftp internal-sftp
""")

    def _write_client_config(self) -> None:
        blocks = []
        for i, (name, address) in enumerate(zip(self.hosts, self.addresses)):
            patterns = name if name == address else f"{name} {address}"
            blocks.append(f"""Host {patterns}
    HostName {address}
    Port {self.ports[i]}
    User {self.user}
    IdentityFile {self.client_key}
    IdentitiesOnly yes
    IdentityAgent none
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    GlobalKnownHostsFile /dev/null
    LogLevel ERROR
    BatchMode yes
    ConnectTimeout 5
    ServerAliveInterval 5
    ServerAliveCountMax 3
""")
        Path(self.ssh_config).write_text("\n".join(blocks))

    def _spawn(self, i: int, port: int | None = None) -> None:
        if port is not None:
            self.ports[i] = port
        elif self._fixed_port is not None:
            self.ports[i] = self._fixed_port
        elif self.netns[i] is not None:
            self.ports[i] = NETNS_PORT
        else:
            self.ports[i] = _free_port(self.addresses[i])
        self._write_sshd_config(i)
        argv = [self.sshd_bin, "-f", str(self.config_path(i)), "-D", "-e"]
        setpriv = which("setpriv")
        if setpriv:  # sshd gets SIGTERM if this process dies without close() (e.g. SIGKILL)
            argv = [setpriv, "--pdeathsig", "TERM", *argv]
        if self.netns[i] is not None:
            # `ip netns exec` (and setpriv) exec the command: the PID is sshd's own.
            argv = [which("ip") or "ip", "netns", "exec", self.netns[i], *argv]
        with open(self.log_path(i), "ab") as log:
            self.procs[i] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                             start_new_session=True)

    def _start(self) -> None:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
        self._keygen(self.client_key, "paramshard-test-client")
        self.authorized_keys.write_text(Path(f"{self.client_key}.pub").read_text())
        for i in range(len(self.addresses)):
            self._keygen(self.workdir / f"host{i}_ed25519", f"paramshard-test-{self.hosts[i]}")
        for i in range(len(self.addresses)):
            self._spawn(i)
        self._write_client_config()
        for i in range(len(self.addresses)):
            self._wait_ready(i)

    def login_argv(self, i: int, *command: str, connect_timeout: float | None = None) -> list[str]:
        argv = list(self.ssh)
        if connect_timeout is not None:
            argv += ["-o", f"ConnectTimeout={max(1, int(connect_timeout))}"]
        argv += [self.hosts[i], *(command or ("true",))]
        if self.netns[i] is not None:  # from inside the host's own namespace: local traffic only
            argv = [which("ip") or "ip", "netns", "exec", self.netns[i], *argv]
        return argv

    def _wait_ready(self, i: int, may_move_port: bool = True) -> None:
        deadline = time.monotonic() + self.start_timeout
        retries_left = 3
        last = ""
        while True:
            proc = self.procs[i]
            if proc.poll() is not None:
                log = _tail(self.log_path(i))
                # A free port probed a moment ago may be taken by now: try another one.
                if (may_move_port and self._fixed_port is None and self.netns[i] is None and retries_left
                        and "Address already in use" in log):
                    retries_left -= 1
                    self._spawn(i)
                    self._write_client_config()
                    continue
                raise SshStartError(f"sshd for {self.hosts[i]} ({self.addresses[i]}:{self.ports[i]}) exited with "
                                    f"code {proc.returncode} before accepting a login; sshd log "
                                    f"{self.log_path(i)}:\n{log}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SshStartError(f"{self.hosts[i]} ({self.addresses[i]}:{self.ports[i]}) did not accept "
                                    f"`ssh -F {self.ssh_config} {self.hosts[i]} true` within "
                                    f"{self.start_timeout} s; last ssh error: {last.strip() or '(none)'}; "
                                    f"sshd log {self.log_path(i)}:\n{_tail(self.log_path(i))}")
            try:
                r = subprocess.run(self.login_argv(i, "true", connect_timeout=min(5, remaining)),
                                   stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                   timeout=max(1.0, remaining))
            except subprocess.TimeoutExpired:
                last = "ssh timed out"
                continue
            if r.returncode == 0:
                return
            last = r.stderr
            time.sleep(0.05)

    # -- stop ---------------------------------------------------------------------------
    def stop_host(self, i: int, grace: float = 3.0) -> None:
        """Stop host i's sshd and everything under it (its sessions and their commands):
        SIGTERM, up to ``grace`` s, then SIGKILL; by PID."""
        proc = self.procs[i]
        if proc is None:
            return
        stop_tree(proc, grace=grace)

    def kill_host(self, i: int) -> None:
        """Host i dies at once: SIGKILL to its sshd and all its sessions."""
        proc = self.procs[i]
        if proc is not None:
            stop_tree(proc, grace=0.5, sig=signal.SIGKILL)

    def restart_host(self, i: int) -> None:
        """Start host i's sshd again (same address, port and keys) and wait for a login."""
        self.stop_host(i)
        self._spawn(i, port=self.ports[i])
        self._wait_ready(i, may_move_port=False)

    def close(self) -> None:
        """Stop every sshd (and its sessions) by PID; remove the work directory if it made it."""
        if self._closed:
            return
        self._closed = True
        for proc in self.procs:
            if proc is not None:
                stop_tree(proc, grace=3.0)
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "SshHosts":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # a forgotten close() still stops the daemons
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


# -- pytest fixtures (import them into a test module: `from tests.engines.sshd import ssh_hosts`) --

@pytest.fixture
def engines():
    """Skip (or fail with PARAMSHARD_REQUIRE_ENGINES=1) unless the SSH engines are installed."""
    require_engines()


@pytest.fixture
def ssh_hosts(tmp_path):
    """A factory: ``ssh_hosts(addresses=..., **SshHosts kwargs) -> SshHosts``, closed after the test.

    Calls :func:`require_engines` first (for the default loopback addresses, or the given ones
    when no netns is given).
    """
    made: list[SshHosts] = []

    def make(addresses: Sequence[str] = DEFAULT_ADDRESSES, **kwargs) -> SshHosts:
        require_engines(() if kwargs.get("netns") else addresses)
        kwargs.setdefault("workdir", tmp_path / f"sshd-{len(made)}")
        hosts = SshHosts(addresses, **kwargs)
        made.append(hosts)
        return hosts

    yield make
    for hosts in made:
        hosts.close()
