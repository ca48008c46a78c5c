import dataclasses
import os
import signal
import sys
import threading

import pytest

from paramshard.env import ClusterEnv
from paramshard.launch.engines.ports import free_ports
from paramshard.launch.engines.local import child_environ
from paramshard.launch.engines.processes import Child, stop_all
from paramshard.server.assembly import build_server


def pytest_configure(config):
    """The tests that signal a launcher need SIGINT and SIGHUP at their defaults. A runner that
    starts the suite in the background (``nohup make test &``, some CI runners) hands it those
    signals ignored; every child inherits that, and a launcher keeps an ignored signal ignored
    (launch/supervision/signals.py: as a nohup'ed launcher should). Restore them for this session."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)


# ``python -c`` of a server under an address-space limit (RLIMIT_AS, as ``ulimit -v`` sets it),
# given as argv[1] in bytes: set before paramshard is imported, as a shell's ulimit would be.
_UNDER_LIMIT = ("import resource, runpy, sys; limit = int(sys.argv.pop(1)); "
                "resource.setrlimit(resource.RLIMIT_AS, (limit, limit)); sys.argv[0] = 'paramshard'; "
                "runpy.run_module('paramshard', run_name='__main__', alter_sys=True)")


def server_argv(address_space: int | None = None) -> list[str]:
    """``paramshard server``, under an address-space limit of ``address_space`` bytes when given."""
    if address_space is None:
        return [sys.executable, "-m", "paramshard", "server"]
    return [sys.executable, "-c", _UNDER_LIMIT, str(address_space), "server"]


class Cluster:
    """Real server processes on free loopback ports; trainers are made by the test.
    ``address_space``: each server's RLIMIT_AS in bytes (None: the test process's own)."""

    def __init__(self, servers: int, trainers: int, mode: str, timeout: float, address_space: int | None = None,
                 in_process: bool | None = None, **env_fields):
        addresses = [f"127.0.0.1:{p}" for p in free_ports(servers)]
        self.base = ClusterEnv(role=None, servers=tuple(addresses), num_trainers=trainers, mode=mode,
                               timeout=timeout, **env_fields)
        if in_process is None:
            in_process = servers_as_threads() and address_space is None
        self.children, self.threads = [], []
        for i in range(servers):
            env = dataclasses.replace(self.base, role="server", server_id=i)
            if in_process:
                # Real sockets on loopback, served by a thread of this process: no process start
                # (1-2 s of CPU each), the same wire and the same server (`make check`).
                self.threads.append(build_server(env).start())
            else:
                self.children.append(Child(f"server {i}", server_argv(address_space),
                                           child_environ(env)))

    def trainer_env(self, trainer_id: int, **overrides) -> ClusterEnv:
        return dataclasses.replace(self.base, role="trainer", trainer_id=trainer_id, **overrides)

    def close(self):
        stop_all(self.children, grace=3)       # together: one grace period, not one per server
        for server in self.threads:
            server.close()


def servers_as_threads() -> bool:
    """`make check` runs the suite's servers as threads of the test process
    (PARAMSHARD_TEST_SERVERS=threads); a test that kills or signals a server asks for processes
    (``cluster(..., in_process=False)``)."""
    return os.environ.get("PARAMSHARD_TEST_SERVERS") == "threads"


@pytest.fixture
def cluster():
    made = []

    def make(servers=2, trainers=1, mode="sync", timeout=20.0, address_space=None, in_process=None, **env_fields):
        c = Cluster(servers, trainers, mode, timeout, address_space, in_process, **env_fields)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def run_in_threads(fns, timeout=60.0):
    """Run callables concurrently; re-raise the first exception; fail on a hang."""
    results, errors = [None] * len(fns), []

    def wrap(i, fn):
        try:
            results[i] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)

    threads = [threading.Thread(target=wrap, args=(i, fn), daemon=True) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        if t.is_alive():
            raise AssertionError(f"a trainer thread did not finish within {timeout} s")
    if errors:
        raise errors[0]
    return results
