"""A server that no trainer ever reaches stops (issue 30, M5): in-process servers on
threads with a short --idle-exit, and one `paramshard server` process for the CLI."""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import paramshard as ps
from paramshard.client.dense import DenseClient
from paramshard.env import ClusterEnv
from paramshard.errors import ParamshardError
from paramshard.launch.engines.ports import free_ports
from paramshard.placement.sharding import ParamSpec, make_plan
from paramshard.server.assembly import build_server
from paramshard.transport.links import ServerLinks

# Starts, stops or kills server processes of its own: `make test` only, not `make check`.
pytestmark = pytest.mark.processes

IDLE = 0.5


def start_server(idle_exit, peers=(), trainers=2):
    env = ClusterEnv(role="server", servers=("127.0.0.1:0", *peers), server_id=0, num_trainers=trainers,
                     mode="async", timeout=30.0, idle_exit=idle_exit)
    server = build_server(env, bind="127.0.0.1:0").start()
    server.wait_ready()
    return server


def wait_stopped(server, deadline=20.0, while_waiting=lambda: None) -> None:
    end = time.monotonic() + deadline
    while server._thread.is_alive():
        assert time.monotonic() < end, f"{server.name} still serving after {deadline} s"
        while_waiting()
        time.sleep(0.1)


@pytest.fixture
def server_log(caplog):
    caplog.set_level("INFO", logger="paramshard.server")
    return caplog


def test_a_server_no_trainer_reaches_stops_naming_what_it_waited_for(server_log):
    [silent_peer] = free_ports(1)           # a peer server that never comes up
    server = start_server(IDLE, peers=(f"127.0.0.1:{silent_peer}",))
    try:
        with ServerLinks([server.address], timeout=5) as links:
            def poll():
                # A monitor polling it the whole time does not keep it alive. The poll that meets
                # its exit gets no reply: that is the exit (wait_stopped then sees the thread end).
                try:
                    links.request(0, {"op": "stats"})
                except ParamshardError:
                    pass
            wait_stopped(server, while_waiting=poll)
    finally:
        server.close()
    assert server.exit_code == 1
    [line] = [r.getMessage() for r in server_log.records if "no trainer ever reached" in r.getMessage()]
    assert "expected 2 trainer(s) (PARAMSHARD_TRAINERS)" in line
    assert f"peer servers it never reached either: server 1 (127.0.0.1:{silent_peer})" in line
    assert "--idle-exit SECONDS / PARAMSHARD_IDLE_EXIT (now 0.5" in line
    assert any("exits if no trainer reaches it within 0.5 s" in r.getMessage() for r in server_log.records)


def test_a_server_a_trainer_reached_keeps_serving(server_log):
    server = start_server(IDLE)
    try:
        with ServerLinks([server.address], timeout=5) as links:
            plan = make_plan([ParamSpec("w", (4,))], 1, min_block_size=1)
            DenseClient(links, plan, 0).register_dense({"w": np.zeros(4, np.float32)}, ps.optim.SGD(lr=1.0))
            time.sleep(10 * IDLE)           # trainer 1 never comes: the job's own rules (timeout 30 s) decide
            assert server._thread.is_alive()
    finally:
        server.close()
    assert server.exit_code == 0
    assert not any("no trainer ever reached" in r.getMessage() for r in server_log.records)


def test_a_hello_starts_the_count_again_and_a_job_request_ends_the_watch(server_log):
    probed, moved = start_server(1.0), start_server(1.0)
    try:
        with ServerLinks([probed.address], timeout=5) as to_probed, \
                ServerLinks([moved.address], timeout=5) as to_moved:
            # A launcher's readiness checks (trainers still starting): each starts the count again.
            # A read of the job's state (as a launcher or replica keeper makes) ends the watch.
            to_moved.request(0, {"op": "snapshot_dense"})
            end = time.monotonic() + 3.0
            while time.monotonic() < end:
                to_probed.request(0, {"op": "hello"})
                assert probed._thread.is_alive()
                time.sleep(0.2)
        wait_stopped(probed)
        assert moved._thread.is_alive()
    finally:
        probed.close()
        moved.close()
    assert probed.exit_code == 1 and moved.exit_code == 0
    [line] = [r.getMessage() for r in server_log.records if "no trainer ever reached" in r.getMessage()]
    assert "hello(s) checking it was up, none for the last 1 s" in line


def test_paramshard_server_without_a_secret_warns_and_exits_when_nobody_comes(tmp_path):
    [port] = free_ports(1)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PARAMSHARD_")}
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    environ.update(PARAMSHARD_ROLE="server", PARAMSHARD_SERVERS=f"127.0.0.1:{port}", PARAMSHARD_SERVER_ID="0",
                   PARAMSHARD_TRAINERS="1", PYTHONPATH=os.path.abspath(src))
    proc = subprocess.run([sys.executable, "-m", "paramshard", "server", "--idle-exit", "1"], env=environ,
                          capture_output=True, text=True, timeout=60)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "WARNING" in out and "UNAUTHENTICATED plain TCP" in out, out
    assert "PARAMSHARD_SECRET" in out and "docs/security.md" in out, out
    assert "exits if no trainer reaches it within 1 s" in out, out
    assert "no trainer ever reached it" in out and "expected 1 trainer(s)" in out, out
