"""Dead servers, bad messages, missing peers: errors within seconds, never hangs."""
import os
import signal
import threading
import time

import msgpack
import numpy as np
import pytest
import torch
import torch.nn as nn
import zmq

import paramshard as ps
from paramshard.client.control import wait_for_servers
from paramshard.errors import DeadlineExceeded, RemoteError, ServerUnavailable
from paramshard.server.core.parameter_server import ParameterServer
from paramshard.trainer.trainer import Trainer
from paramshard.transport import protocol
from tests.conftest import run_in_threads

# Starts, stops or kills server processes of its own: `make test` only, not `make check`.
pytestmark = pytest.mark.processes


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 200), nn.Linear(200, 4))


def two_trainers(c):
    """Two trainers built concurrently (the non-chief waits for the chief's registration)."""
    models = [model(), model()]
    trainers = run_in_threads([lambda t=t: Trainer(models[t], ps.optim.SGD(lr=0.1), env=c.trainer_env(t))
                               for t in range(2)], timeout=20)
    return models, trainers


def test_killed_server_fails_the_step_fast_and_names_it(cluster):
    c = cluster(servers=2, trainers=1, timeout=60.0, min_block_size=4096)
    m = model()
    trainer = Trainer(m, ps.optim.SGD(lr=0.1), env=c.trainer_env(0))
    trainer.step(m(torch.randn(8, 64)).sum())
    os.kill(c.children[1].pid, signal.SIGKILL)
    c.children[1].proc.wait(5)
    start = time.monotonic()
    with pytest.raises(ServerUnavailable, match=r"server 1 \(127\.0\.0\.1:\d+\)"):
        for _ in range(3):
            trainer.step(m(torch.randn(8, 64)).sum())
    assert time.monotonic() - start < 8, "the dead server must be noticed within seconds"
    trainer.links.close()


def test_killed_server_wakes_a_trainer_waiting_at_the_sync_barrier(cluster):
    c = cluster(servers=2, trainers=2, timeout=60.0, min_block_size=4096)
    models, trainers = two_trainers(c)
    # trainer 0 pushes step 0 and waits for trainer 1, who never pushes; then server 0 dies.
    threading.Timer(1.0, lambda: os.kill(c.children[0].pid, signal.SIGKILL)).start()
    start = time.monotonic()
    with pytest.raises(ServerUnavailable, match="server 0"):
        trainers[0].step(models[0](torch.randn(8, 64)).sum())
    assert time.monotonic() - start < 8
    for t in trainers:
        t.links.close()


def test_barrier_timeout_names_the_missing_trainer(cluster):
    c = cluster(servers=1, trainers=2, timeout=3.0)
    models, trainers = two_trainers(c)
    with pytest.raises(RemoteError, match=r"trainers \[1\] have not pushed"):
        trainers[0].step(models[0](torch.randn(8, 64)).sum())
    for t in trainers:
        t.links.close()


def test_non_chief_waits_for_registration_then_names_the_chief(cluster):
    c = cluster(servers=1, trainers=2, timeout=2.0)
    # The server up first: on a loaded machine its start took longer than the 2 s deadline,
    # and the trainer then failed on an unreachable server instead of on the registration.
    wait_for_servers(c.base, who="test", timeout=60)
    start = time.monotonic()
    with pytest.raises(RemoteError, match=r"chief \(trainer 0\) has not registered"):
        Trainer(model(), ps.optim.SGD(lr=0.1), env=c.trainer_env(1))
    # It waited for the registration deadline (2 s), then failed rather than hanging.
    assert 1.5 < time.monotonic() - start < 60


def test_unreachable_server_deadline_says_so():
    env = ps.env.ClusterEnv(role="trainer", servers=("127.0.0.1:9",), timeout=1.0)
    with pytest.raises(DeadlineExceeded, match=r"server 0 \(127\.0\.0\.1:9\).*never reachable"):
        Trainer(model(), ps.optim.SGD(lr=0.1), env=env)


def test_trainer_with_a_different_model_is_refused(cluster):
    c = cluster(servers=1, trainers=2, timeout=10.0)
    Trainer(model(), ps.optim.SGD(lr=0.1), env=c.trainer_env(0))
    other = nn.Sequential(nn.Linear(64, 100), nn.Linear(100, 4))
    with pytest.raises(RemoteError, match="differs from the one the chief registered"):
        Trainer(other, ps.optim.SGD(lr=0.1), env=c.trainer_env(1))


@pytest.fixture
def server():
    s = ParameterServer(0, "127.0.0.1:0", num_trainers=1, timeout=5.0).start()
    s.wait_ready()
    yield s
    s.close()


def _ask(sock, frames, timeout_ms=3000):
    sock.send_multipart(frames)
    assert sock.poll(timeout_ms), "the server did not answer"
    reply = sock.recv_multipart()
    return msgpack.unpackb(reply[0])


def hdr(**fields):
    return msgpack.packb({"v": protocol.PROTOCOL_VERSION, "id": 7, "arrays": [], **fields})


@pytest.mark.parametrize("frames,expected", [
    ([b"\xc1garbage"], "not valid msgpack"),
    ([msgpack.packb([1, 2])], "header must be a map"),
    ([msgpack.packb({"v": 99, "id": 1, "op": "hello", "arrays": []})], "protocol version 99"),
    ([hdr(op="explode")], "unknown op 'explode'"),
    ([hdr(op="pull_dense", names=["w.block0"])], "missing field 'min_version'"),
    ([hdr(op="pull_dense", names="w", min_version=0, plan_fingerprint=0)], "field 'names' must be str_list"),
    ([msgpack.packb({"v": 1, "id": 3, "op": "push_dense", "names": ["x"], "step": 0, "trainer": 0,
                     "reply_values": False, "arrays": [{"dtype": "float32", "shape": [4]}]}), b"\0" * 12],
     "needs 16 bytes, frame has 12"),
    ([msgpack.packb({"v": 1, "id": 3, "op": "push_dense", "names": ["x"], "step": 0, "trainer": 0,
                     "reply_values": False, "arrays": [{"dtype": "object", "shape": [1]}]}), b"\0" * 8],
     "dtype must be one of"),
    ([hdr(op="push_dense", names=["nope"], step=0, trainer=0, reply_values=False)], "carries 0 arrays"),
])
def test_malformed_message_gets_an_error_reply_and_server_keeps_serving(server, frames, expected):
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://{server.address}")
    try:
        reply = _ask(sock, frames)
        assert reply["ok"] is False
        assert expected in reply["message"]
        assert _ask(sock, [hdr(op="hello")])["ok"] is True   # still serving
        assert server.stats["errors"] >= 1
    finally:
        sock.close(0)


def test_wrong_gradient_shape_is_rejected_without_touching_the_block(server):
    from paramshard.client.dense import DenseClient
    from paramshard.placement.sharding import ParamSpec, make_plan
    from paramshard.transport.links import ServerLinks
    plan = make_plan([ParamSpec("w", (100,))], 1)
    with ServerLinks([server.address], timeout=5) as links:
        client = DenseClient(links, plan, 0)
        client.register_dense({"w": np.ones(100, np.float32)}, ps.optim.SGD(lr=1.0))
        bad = {"op": "push_dense", "names": ["w.block0"], "step": 0, "trainer": 0, "reply_values": False}
        with pytest.raises(RemoteError, match=r"gradient is float32\[99\]"):
            links.request(0, bad, [np.ones(99, np.float32)])
        unknown = {**bad, "names": ["nope.block0"]}
        with pytest.raises(RemoteError, match=r"unknown blocks \['nope.block0'\]"):
            links.request(0, unknown, [np.ones(100, np.float32)])
        out = {"w": np.zeros(100, np.float32)}
        client.pull_dense(out, 0)
        np.testing.assert_array_equal(out["w"], 1.0)


def test_a_trainer_that_dies_fails_the_others_barrier_within_seconds(cluster, tmp_path):
    """Trainer 1 is a separate process killed with SIGKILL: trainer 0's sync step
    must fail fast naming it, not wait for the 60 s deadline."""
    import subprocess
    import sys
    import textwrap
    c = cluster(servers=1, trainers=2, timeout=60.0)
    script = tmp_path / "t1.py"
    script.write_text(textwrap.dedent("""
        import time, torch, torch.nn as nn
        import paramshard as ps
        from paramshard.trainer.trainer import Trainer
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(64, 200), nn.Linear(200, 4))
        Trainer(m, ps.optim.SGD(lr=0.1))
        print("ready", flush=True)
        time.sleep(60)
    """))
    from paramshard.launch.engines.local import child_environ
    child = subprocess.Popen([sys.executable, str(script)], env=child_environ(c.trainer_env(1)),
                             stdout=subprocess.PIPE, text=True)
    try:
        m = model()
        trainer = Trainer(m, ps.optim.SGD(lr=0.1), env=c.trainer_env(0))
        assert child.stdout.readline().strip() == "ready"
        threading.Timer(1.0, child.kill).start()
        start = time.monotonic()
        with pytest.raises(RemoteError, match=r"trainers \[1\] lost their connection"):
            trainer.step(m(torch.randn(8, 64)).sum())
        assert time.monotonic() - start < 10
        trainer.links.close()
    finally:
        child.kill()
        child.wait(10)


def test_a_trainer_started_before_its_servers_waits_for_them(tmp_path):
    """Start order does not matter: the servers come up 2 s after the trainer."""
    import dataclasses
    import sys
    from paramshard.launch.engines.local import child_environ
    from paramshard.launch.engines.ports import free_ports
    from paramshard.launch.engines.processes import Child, stop_all
    addresses = tuple(f"127.0.0.1:{p}" for p in free_ports(2))
    base = ps.env.ClusterEnv(role=None, servers=addresses, num_trainers=1, timeout=20.0, min_block_size=4096)
    servers = []
    try:
        def start_servers():
            for i in range(2):
                env = dataclasses.replace(base, role="server", server_id=i)
                servers.append(Child(f"server {i}", [sys.executable, "-m", "paramshard", "server"],
                                     child_environ(env)))
        threading.Timer(2.0, start_servers).start()
        m = model()
        start = time.monotonic()
        trainer = Trainer(m, ps.optim.SGD(lr=0.1), env=dataclasses.replace(base, role="trainer", trainer_id=0))
        assert time.monotonic() - start >= 1.5
        trainer.step(m(torch.randn(8, 64)).sum())
        trainer.close()
    finally:
        time.sleep(0.1)
        stop_all(servers, grace=3)
