"""Issue 32 (4): ``WARNING server 1: named unreachable by server 0 but alive and reporting ...: not
killed`` on successful runs, at the job's end.

Two real servers on loopback (threads of this process), each one's status lines kept apart as the
launcher's pump of that server's own pipe keeps them (launch/engines/processes.py). At the end of
its job server 1 writes its last line (``stopping``) and only then closes its sockets, so server 0
can name it only after that line was written; but the two pipes are read by two threads, in no
order with each other, so the launcher may read server 0's accusation first. Delivering the lines
in that order makes the race deterministic: the launcher must wait for the accused's own word, and
still warn about a server that keeps reporting while named (a partition)."""
import dataclasses
import logging
import threading
import time

import pytest

from paramshard.env import ClusterEnv
from paramshard.launch.api import JobSpec, Launcher, RankSpec
from paramshard.launch.supervision.peer_loss import SILENT_AFTER
from paramshard.messages.status_lines import PeerStatus
from paramshard.server.core.parameter_server import ParameterServer

DEADLINE = 15.0     # seconds for a loopback handshake or a disconnect to show in a status line


class Pipe:
    """One server's status lines as written, and the launcher's end: what it has read so far."""

    def __init__(self, tag: str):
        self.tag, self.pid, self.code = tag, 7, None
        self.written: list[PeerStatus] = []
        self.lock = threading.Lock()
        self.read: tuple[PeerStatus | None, float | None] = (None, None)

    def write(self, status: PeerStatus) -> None:
        with self.lock:
            self.written.append(status)

    def newest(self) -> PeerStatus | None:
        with self.lock:
            return self.written[-1] if self.written else None

    def deliver(self, status: PeerStatus, age: float = 0.0) -> None:
        """The launcher's pump reads ``status`` (``age`` s ago)."""
        self.read = (status, time.monotonic() - age)

    # -- what the launcher asks of a process (launch/engines/process.py) --
    def poll(self):
        return self.code

    def last_status(self):
        return self.read

    def describe_exit(self):
        return f"{self.tag} is still running"


class Engine:
    def __init__(self, processes):
        self.processes = list(processes)

    def start(self, rank):
        return self.processes.pop(0)

    def stop(self, processes, grace, hurry):
        pass


def _wait_for(what: str, check):
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"no {what} within {DEADLINE:g} s")


@pytest.fixture
def two_servers(monkeypatch):
    """Servers 0 and 1 watching each other, each writing its status lines into its own Pipe."""
    pipes = {0: Pipe("server 0"), 1: Pipe("server 1")}

    def to_its_pipe(line: str) -> None:
        status = PeerStatus.parse(line)
        assert status is not None, line
        pipes[status.server].write(status)
    monkeypatch.setattr("paramshard.server.core.peers.launcher_report", lambda: to_its_pipe)
    servers = [ParameterServer(i, "127.0.0.1:0", num_trainers=1, timeout=60.0) for i in range(2)]
    try:
        for i, server in enumerate(servers):
            server.watch_peers({1 - i: servers[1 - i].address})
            server.start().wait_ready()
        yield servers, pipes
    finally:
        for server in servers:
            server.close()


def _launcher(pipes) -> Launcher:
    base = ClusterEnv(role=None, servers=("127.0.0.1:1",) * 2, num_trainers=1, timeout=60.0)
    launcher = Launcher(Engine([pipes[0], pipes[1]]))
    launcher.start_job(JobSpec(tuple(RankSpec(f"server {i}", dataclasses.replace(base, role="server", server_id=i),
                                              ("x",)) for i in range(2)), ()))
    return launcher


def _warnings(caplog, launcher) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="paramshard"):
        launcher._peer_verdict()
    return [r.getMessage() for r in caplog.records if "named unreachable" in r.getMessage()]


def test_a_server_stopping_at_the_end_of_its_job_is_not_reported_alive_when_its_last_line_comes_late(
        two_servers, caplog):
    servers, pipes = two_servers
    _wait_for("status lines with both servers reached", lambda: all(
        p.newest() is not None and p.newest().unseen == () for p in pipes.values()))
    launcher = _launcher(pipes)
    before = {i: p.newest() for i, p in pipes.items()}
    for i, p in pipes.items():
        p.deliver(before[i], age=0.3)
    assert _warnings(caplog, launcher) == []
    # The end of server 1's job: its serving loop ends as when every trainer left (its peer watch
    # writes its last line, then its sockets close), and server 0 names it.
    servers[1].close()
    stopped = _wait_for("last status line of server 1", lambda: pipes[1].newest().stopping and pipes[1].newest())
    accusation = _wait_for("status line of server 0 naming server 1",
                           lambda: 1 in (pipes[0].newest().unreachable) and pipes[0].newest())
    # The launcher reads server 0's pipe first; server 1's last line is still in its own.
    pipes[0].deliver(accusation)
    assert _warnings(caplog, launcher) == []
    # Then server 1's pump catches up: it stops, however long it may take to exit.
    pipes[1].deliver(stopped)
    assert _warnings(caplog, launcher) == []
    pipes[0].deliver(accusation, age=SILENT_AFTER + 1)
    assert _warnings(caplog, launcher) == []
    # What the launcher must still say: had server 1 kept reporting without stopping (cut from
    # server 0 only: a partition), the same accusation, once it stood, is a warning.
    pipes[1].deliver(before[1], age=0.3)
    assert _warnings(caplog, launcher) == [
        "server 1: named unreachable by server 0 but alive and reporting (it still reports to the launcher): "
        "not killed"]
