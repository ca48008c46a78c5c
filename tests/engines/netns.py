"""A small network of "hosts" made of Linux network namespaces, for partition tests.

    with NetnsLab(3) as lab:                      # 10.213.7.10, .11, .12 on one bridge
        lab.run(0, ["python3", "-c", "..."])      # a process inside host 0's namespace
        lab.cut(1)                                # host 1 silently off the network
        lab.restore(1)

Layout (names carry a random tag, so parallel runs do not clash):

    pshd-TAG-br   bridge namespace: bridge ``br0`` with ports ``p0``..``pN-1``
    pshd-TAG-hI   host I: ``lo`` up, ``eth0`` (veth peer of ``pI``) with 10.213.7.(10+I)/24

No interface is created in the root namespace. SAFETY: the root namespace would route the
lab's private subnet out of the machine (default route), so for the lab's lifetime the root
namespace gets ``ip route add unreachable SUBNET metric M`` (M unique to this lab, so labs on
the same subnet can overlap), removed on close: a connect from the root namespace to a lab
address fails at once and nothing leaves the machine. Clients must start inside a namespace
(:meth:`NetnsLab.run`). Inside a namespace the machine's hostname resolves to 127.0.0.1:
use :attr:`NetnsLab.addresses`, never the hostname.

Cleanup kills every process still inside the lab's namespaces (``ip netns pids``, by PID),
deletes the namespaces, then removes the route; it runs on close(), on an exception while
building the lab and at interpreter exit. Labs left behind by a process that died (its lock
file in /run/paramshard-netns is no longer held) are cleaned up when the next lab starts.
"""

from __future__ import annotations

import atexit
import fcntl
import ipaddress
import json
import os
import random
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from tests.engines import start_time, stop_processes, unavailable

PREFIX = "pshd-"
STATE_DIR = Path("/run/paramshard-netns")
_NAME_RE = re.compile(r"^pshd-([0-9a-f]{8})-(br|h\d+)$")


class NetnsError(RuntimeError):
    pass


def _ip(*args: str, check: bool = True, ns: str | None = None) -> subprocess.CompletedProcess:
    argv = ["ip", *(["-n", ns] if ns else []), *args]
    r = subprocess.run(argv, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed ({r.returncode}): {r.stderr.strip()}")
    return r


def _list_netns() -> list[str]:
    r = _ip("netns", "list", check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def _netns_pids(ns: str) -> list[int]:
    r = _ip("netns", "pids", ns, check=False)
    return [int(p) for p in r.stdout.split() if p.isdigit()]


def _kill_netns_processes(ns: str, grace: float = 2.0) -> None:
    """Stop every process inside namespace ``ns`` (which this code created), by PID."""
    procs = [(pid, st) for pid in _netns_pids(ns) if (st := start_time(pid)) is not None]
    if procs:
        stop_processes(procs, grace=grace)


def _delete_netns(ns: str) -> None:
    _kill_netns_processes(ns)
    for _ in range(50):
        r = _ip("netns", "del", ns, check=False)
        if r.returncode == 0 or ns not in _list_netns():
            return
        time.sleep(0.05)
    raise NetnsError(f"could not delete namespace {ns}: {r.stderr.strip()}")


def _route_args(subnet: str, metric: int) -> list[str]:
    return ["route", "del", "unreachable", subnet, "metric", str(metric)]


def cleanup_stale() -> list[str]:
    """Remove labs whose owning process is gone (their lock is free); return what was removed.

    Only namespaces named ``pshd-<8 hex>-...`` and routes recorded in /run/paramshard-netns.
    """
    removed: list[str] = []
    live_tags: set[str] = set()
    if STATE_DIR.is_dir():
        for state in STATE_DIR.glob("*.json"):
            tag = state.stem
            try:
                fd = os.open(state, os.O_RDWR)
            except OSError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    live_tags.add(tag)  # its lab is running
                    continue
                try:
                    info = json.loads(state.read_text() or "{}")
                except (OSError, ValueError):
                    info = {}
                for ns in info.get("namespaces", []):
                    if ns in _list_netns():
                        _delete_netns(ns)
                        removed.append(ns)
                if "subnet" in info and "metric" in info:
                    if _ip(*_route_args(info["subnet"], info["metric"]), check=False).returncode == 0:
                        removed.append(f"route unreachable {info['subnet']} metric {info['metric']}")
                state.unlink(missing_ok=True)
            finally:
                os.close(fd)
        for tmp in STATE_DIR.glob(".*.tmp"):  # a lab that died between open and rename
            try:
                fd = os.open(tmp, os.O_RDWR)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                tmp.unlink(missing_ok=True)
            except BlockingIOError:
                pass
            finally:
                os.close(fd)
    # Namespaces of ours with no state file at all (it is written before any namespace exists,
    # so such a namespace's lab is gone).
    for ns in _list_netns():
        m = _NAME_RE.match(ns)
        if m and m.group(1) not in live_tags and not (STATE_DIR / f"{m.group(1)}.json").exists():
            _delete_netns(ns)
            removed.append(ns)
    return removed


def require_netns() -> None:
    """Skip (or fail, with PARAMSHARD_REQUIRE_ENGINES=1) unless network namespaces can be made."""
    if os.geteuid() != 0:
        unavailable("the network-namespace tests need root")
    if shutil.which("ip") is None:
        unavailable("`ip` (iproute2) is missing")
    global _netns_problem
    if _netns_problem is None:
        probe = f"{PREFIX}probe-{secrets.token_hex(4)}"
        r = _ip("netns", "add", probe, check=False)
        if r.returncode == 0:
            _ip("netns", "del", probe, check=False)
            _netns_problem = ""
        else:
            _netns_problem = f"`ip netns add` does not work here: {r.stderr.strip()}"
    if _netns_problem:
        # Not an install problem (the kernel or the container forbids it): the engine
        # truly cannot run here, so this skips even where the engines are required.
        import pytest
        pytest.skip(f"{_netns_problem}; network namespaces need root with CAP_NET_ADMIN on a kernel that allows them")


_netns_problem: str | None = None


class NetnsLab:
    """``n_hosts`` network namespaces on one bridge; a context manager.

    Attributes: ``tag``, ``bridge_ns``, ``namespaces`` (host i's namespace name),
    ``addresses`` (host i's IPv4 address), ``subnet``, ``prefixlen``, ``route_metric``.
    """

    def __init__(self, n_hosts: int, subnet: str = "10.213.7.0/24", *, first_host: int = 10,
                 clean_stale: bool = True):
        if n_hosts < 1:
            raise ValueError("n_hosts must be at least 1")
        net = ipaddress.ip_network(subnet)
        if net.version != 4 or not net.is_private or net.is_loopback:
            raise ValueError(f"subnet must be a private IPv4 network, not {subnet}")
        if first_host + n_hosts >= net.num_addresses - 1:
            raise ValueError(f"{subnet} is too small for {n_hosts} hosts from .{first_host}")
        self.subnet = str(net)
        self.prefixlen = net.prefixlen
        self.addresses = [str(net.network_address + first_host + i) for i in range(n_hosts)]
        self.tag = secrets.token_hex(4)
        self.bridge_ns = f"{PREFIX}{self.tag}-br"
        self.namespaces = [f"{PREFIX}{self.tag}-h{i}" for i in range(n_hosts)]
        self.route_metric: int | None = None
        self.procs: list[subprocess.Popen] = []
        self._created: list[str] = []
        self._lock_fd: int | None = None
        self._state: Path | None = None
        self._closed = False
        if clean_stale:
            cleanup_stale()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        atexit.register(self.close)

    # -- build ----------------------------------------------------------------------------
    def _write_state(self) -> None:
        assert self._state is not None and self._lock_fd is not None
        data = json.dumps({"pid": os.getpid(), "namespaces": [self.bridge_ns, *self.namespaces],
                           "subnet": self.subnet, "metric": self.route_metric}).encode()
        os.ftruncate(self._lock_fd, 0)
        os.pwrite(self._lock_fd, data, 0)

    def _build(self) -> None:
        # 1. The lock/state file first (created under a temporary name, locked, then renamed,
        #    so nobody ever sees it unlocked while this lab lives).
        STATE_DIR.mkdir(mode=0o700, exist_ok=True)
        tmp = STATE_DIR / f".{self.tag}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        self._lock_fd = fd
        self._state = STATE_DIR / f"{self.tag}.json"
        os.rename(tmp, self._state)
        self._write_state()

        # 2. The safety route, before any lab address exists anywhere.
        for _ in range(20):
            metric = random.randint(40000, 60000)
            r = _ip("route", "add", "unreachable", self.subnet, "metric", str(metric), check=False)
            if r.returncode == 0:
                self.route_metric = metric
                break
            if "File exists" not in r.stderr:
                raise NetnsError(f"could not add `ip route add unreachable {self.subnet}`: {r.stderr.strip()}")
        else:
            raise NetnsError(f"no free metric for the unreachable route to {self.subnet}")
        self._write_state()
        for address in self.addresses:
            r = _ip("route", "get", address, check=False)
            if not ("No route to host" in r.stderr or r.stdout.startswith("unreachable")):
                raise NetnsError(f"the root namespace does not route {address} as unreachable "
                                 f"(`ip route get {address}`: {r.stdout.strip() or r.stderr.strip()})")

        # 3. Namespaces, bridge, veths, addresses.
        for ns in [self.bridge_ns, *self.namespaces]:
            _ip("netns", "add", ns)
            self._created.append(ns)
            _ip("link", "set", "lo", "up", ns=ns)
        br = self.bridge_ns
        _ip("link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0", ns=br)
        _ip("link", "set", "br0", "up", ns=br)
        for i, ns in enumerate(self.namespaces):
            _ip("link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0", "netns", ns, ns=br)
            _ip("link", "set", f"p{i}", "master", "br0", ns=br)
            _ip("link", "set", f"p{i}", "up", ns=br)
            _ip("addr", "add", f"{self.addresses[i]}/{self.prefixlen}", "dev", "eth0", ns=ns)
            _ip("link", "set", "eth0", "up", ns=ns)

    # -- use ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.namespaces)

    def argv(self, i: int, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run inside host i's namespace (``ip netns exec NS ...``)."""
        return ["ip", "netns", "exec", self.namespaces[i], *argv]

    def run(self, i: int, argv: Sequence[str], **popen_kwargs) -> subprocess.Popen:
        """Start ``argv`` inside host i's namespace; the lab stops it (and its namespace's
        other processes) on close. ``ip netns exec`` execs, so the Popen's PID is argv's own."""
        if self._closed:
            raise NetnsError("the lab is closed")
        popen_kwargs.setdefault("stdin", subprocess.DEVNULL)
        popen_kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(self.argv(i, argv), **popen_kwargs)
        self.procs.append(proc)
        return proc

    def check_call(self, i: int, argv: Sequence[str], timeout: float = 30.0, **kwargs) -> subprocess.CompletedProcess:
        """Run ``argv`` inside host i's namespace to completion (subprocess.run, with a timeout)."""
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.argv(i, argv), timeout=timeout, **kwargs)

    def cut(self, i: int) -> None:
        """Silently partition host i: its bridge port goes down; packets to and from it are dropped."""
        _ip("link", "set", f"p{i}", "down", ns=self.bridge_ns)

    def restore(self, i: int) -> None:
        """Undo :meth:`cut`."""
        _ip("link", "set", f"p{i}", "up", ns=self.bridge_ns)

    # -- close ----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every process started here or living in the lab's namespaces (by PID), delete
        the namespaces, remove the unreachable route and the state file. Idempotent."""
        if self._closed:
            return
        self._closed = True
        errors: list[str] = []
        try:
            procs = [(p.pid, st) for p in self.procs if p.poll() is None and (st := start_time(p.pid)) is not None]
            stop_processes(procs, grace=2.0, popens=self.procs)
        except Exception as exc:  # noqa: BLE001 - keep cleaning
            errors.append(f"stopping processes: {exc}")
        for ns in reversed(self._created):
            try:
                _delete_netns(ns)
            except Exception as exc:  # noqa: BLE001
                errors.append(str(exc))
        if self.route_metric is not None and not errors:
            # Only once no lab namespace (and so no lab address) is left.
            r = _ip(*_route_args(self.subnet, self.route_metric), check=False)
            if r.returncode != 0 and "No such process" not in r.stderr:
                errors.append(f"removing the unreachable route: {r.stderr.strip()}")
            else:
                self.route_metric = None
        if not errors and self._state is not None:
            self._state.unlink(missing_ok=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the lock: a later cleanup_stale() finishes the job
            self._lock_fd = None
        try:
            atexit.unregister(self.close)
        except Exception:  # noqa: BLE001
            pass
        if errors:
            raise NetnsError("NetnsLab cleanup incomplete: " + "; ".join(errors))

    def __enter__(self) -> "NetnsLab":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- pytest fixture (import it into a test module: `from tests.engines.netns import netns_lab`) --

import pytest  # noqa: E402


def lab_factory(lab_class, require):
    """A pytest fixture's body: ``require()``, then a factory of ``lab_class(n_hosts, subnet,
    **kwargs)`` labs, every one closed after the test (shaped.py's fixture is one too)."""
    require()
    made: list = []

    def make(n_hosts: int, subnet: str = "10.213.7.0/24", **kwargs):
        lab = lab_class(n_hosts, subnet, **kwargs)
        made.append(lab)
        return lab

    yield make
    errors = []
    for lab in reversed(made):
        try:
            lab.close()
        except NetnsError as exc:
            errors.append(str(exc))
    if errors:
        raise NetnsError("; ".join(errors))


@pytest.fixture
def netns_lab():
    """A factory ``netns_lab(n_hosts, subnet=...) -> NetnsLab``; every lab is closed after the test."""
    yield from lab_factory(NetnsLab, require_netns)
