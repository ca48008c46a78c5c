"""PARAMSHARD_SECRET / PARAMSHARD_JOB_ID / PARAMSHARD_KEYS_DIR: CurveZMQ on every connection.

Oracles: a process without the job's keys is refused within seconds with an
error saying what to set, and nothing it sends (plain messages, or a recorded
encrypted stream replayed over a new connection) reaches the server's request
loop: the server's request count and values are unchanged, read by a
legitimate client. Each attack is also run against a server without a secret,
where it must work, which shows the oracle would catch it.
"""
import os
import select
import socket
import threading
import time

import numpy as np
import pytest
import torch
import torch.nn as nn
import zmq
import zmq.auth

import paramshard as ps
from paramshard.client.dense import DenseClient
from paramshard.errors import ConfigError, ServerUnavailable
from paramshard.server.core.parameter_server import ParameterServer
from paramshard.placement.sharding import ParamSpec, make_plan
from paramshard.trainer.trainer import Trainer
from paramshard.transport import protocol
from paramshard.transport.links import ServerLinks
from paramshard.transport.security import HandshakeRefused, Security

FIX = "set the same PARAMSHARD_SECRET and PARAMSHARD_JOB_ID"


def model():
    torch.manual_seed(0)
    return nn.Linear(16, 4)


# -- keys -------------------------------------------------------------------
def test_keys_are_derived_per_secret_and_job():
    a = Security.from_secret("s3cret", "job-a")
    assert a == Security.from_secret("s3cret", "job-a")           # every process derives the same keys
    assert a.server_public == zmq.curve_public(a.server_secret)
    assert a.client_public == zmq.curve_public(a.client_secret)
    assert a.server_public != a.client_public
    others = [Security.from_secret("s3cret", "job-b"), Security.from_secret("other", "job-a"),
              Security.from_secret("s3cret", ""), Security.from_secret("s3cret", "job-a\0")]
    keys = {a.server_public, a.client_public}
    for o in others:
        assert not {o.server_public, o.client_public} & keys
    assert "s3cret" not in repr(a) and a.server_secret.decode() not in repr(a)


def test_security_from_env():
    env = ps.env.ClusterEnv(role=None)
    assert Security.from_env(env) is None                          # plain TCP, as without this feature
    assert Security.from_env(ps.env.ClusterEnv(role=None, secret="s", job_id="j")) == \
        Security.from_secret("s", "j")
    with pytest.raises(ConfigError, match="not both"):
        Security.from_env(ps.env.ClusterEnv(role=None, secret="s", keys_dir="/tmp"))
    with pytest.raises(ConfigError, match="not a directory"):
        Security.from_keys_dir("/nonexistent/keys")


# -- a job with a secret ------------------------------------------------------
def test_job_with_a_shared_secret_trains(cluster):
    c = cluster(servers=2, trainers=1, secret="s3cret", job_id="job-a")
    m = model()
    trainer = Trainer(m, ps.optim.SGD(lr=0.1), env=c.trainer_env(0))
    trainer.step(m(torch.ones(2, 16)).sum())
    assert all(s["errors"] == 0 for s in trainer.server_stats())
    trainer.close()


@pytest.mark.parametrize("overrides,detail", [
    ({"secret": None}, "it requires CurveZMQ and this process has no secret|closed the connection"),
    ({"secret": "wrong"}, "closed the connection during the handshake"),
    ({"job_id": "job-b"}, "closed the connection during the handshake"),
], ids=["no-secret", "wrong-secret", "other-job"])
def test_trainer_without_the_jobs_keys_is_refused_fast_and_servers_keep_serving(cluster, overrides, detail):
    c = cluster(servers=2, trainers=1, secret="s3cret", job_id="job-a", timeout=60)
    start = time.monotonic()
    with pytest.raises(HandshakeRefused, match=r"server \d \(127\.0\.0\.1:\d+\)") as refused:
        Trainer(model(), ps.optim.SGD(lr=0.1), env=c.trainer_env(0, **overrides))
    assert time.monotonic() - start < 10
    assert FIX in str(refused.value)
    assert refused.match(detail)
    assert isinstance(refused.value, ServerUnavailable)
    m = model()
    trainer = Trainer(m, ps.optim.SGD(lr=0.1), env=c.trainer_env(0))   # the right one still works
    trainer.step(m(torch.ones(2, 16)).sum())
    # Nothing of the refused trainer reached the servers' request loops.
    assert all(s["errors"] == 0 for s in trainer.server_stats())
    trainer.close()


def test_trainer_with_a_secret_against_a_server_without_one_is_refused(cluster):
    c = cluster(servers=1, trainers=1, timeout=60)
    start = time.monotonic()
    with pytest.raises(HandshakeRefused, match=FIX):
        Trainer(model(), ps.optim.SGD(lr=0.1), env=c.trainer_env(0, secret="s3cret"))
    assert time.monotonic() - start < 10


# -- a job with key files -----------------------------------------------------
def _keys(directory, *names):
    os.makedirs(directory, exist_ok=True)
    for name in names:
        zmq.auth.create_certificates(directory, name)
    return str(directory)


def test_job_with_a_keys_directory_trains_and_refuses_another_client_key(cluster, tmp_path):
    keys = _keys(tmp_path / "job", "server", "client")
    c = cluster(servers=1, trainers=1, keys_dir=keys, timeout=60)
    m = model()
    trainer = Trainer(m, ps.optim.SGD(lr=0.1), env=c.trainer_env(0))
    trainer.step(m(torch.ones(2, 16)).sum())
    # Knows the server's public key but holds another client key pair: ZAP says no.
    other = _keys(tmp_path / "other", "client")
    os.link(os.path.join(keys, "server.key"), os.path.join(other, "server.key"))
    start = time.monotonic()
    with pytest.raises(HandshakeRefused, match="did not accept this process's key"):
        with ServerLinks(c.base.servers, 60, security=Security.from_keys_dir(other)) as links:
            links.wait_ready(60)
    assert time.monotonic() - start < 10
    assert trainer.server_stats()[0]["errors"] == 0
    trainer.close()


def test_keys_directory_missing_a_file_says_which():
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        _keys(d, "client")
        with pytest.raises(ConfigError, match="neither server.key nor server.key_secret"):
            Security.from_keys_dir(d)


# -- one process, two jobs ----------------------------------------------------
def test_two_servers_with_different_secrets_in_one_process_keep_their_clients_apart():
    """ZAP is per zmq.Context: each CURVE server has its own, so neither admits the other's clients."""
    a, b = Security.from_secret("s3cret", "job-a"), Security.from_secret("s3cret", "job-b")
    servers = [ParameterServer(i, "127.0.0.1:0", num_trainers=1, timeout=5.0, security=sec).start()
               for i, sec in enumerate((a, b))]
    try:
        for s in servers:
            s.wait_ready()
        for s, right, wrong in ((servers[0], a, b), (servers[1], b, a)):
            with ServerLinks([s.address], 10, security=right) as links:
                assert links.wait_ready(10)[0]["server"] == s.server_id
            with pytest.raises(HandshakeRefused):
                with ServerLinks([s.address], 10, security=wrong) as links:
                    links.wait_ready(10)
    finally:
        for s in servers:
            s.close()


# -- attacks: plain messages, replayed streams --------------------------------
PLAN = make_plan([ParamSpec("w", (100,))], 1)
PUSH = {"op": "push_dense", "names": ["w.block0"], "step": 0, "trainer": 0, "reply_values": False}


def _values(links) -> np.ndarray:
    out = {"w": np.zeros(100, np.float32)}
    DenseClient(links, PLAN, 0).pull_dense(out, 0)
    return out["w"]


def _requests_seen(links) -> int:
    """The server's request count (this stats request included)."""
    return links.request(0, {"op": "stats"})[0]["stats"]["requests"]


def _registered_job(cluster, secret):
    """An async job whose w is all ones (SGD, lr 1: every push of ones subtracts 1)."""
    c = cluster(servers=1, trainers=1, mode="async", secret=secret, job_id="job-a", timeout=30)
    links = ServerLinks.for_job(c.trainer_env(0))
    DenseClient(links, PLAN, 0).register_dense({"w": np.ones(100, np.float32)}, ps.optim.SGD(lr=1.0))
    return c, links


def _wait_for(condition, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("secret", [None, "s3cret"], ids=["control-plain", "curve"])
def test_a_client_without_keys_sending_a_valid_push_has_no_effect(cluster, secret):
    c, links = _registered_job(cluster, secret)
    try:
        seen = _requests_seen(links)
        ctx = zmq.Context.instance()
        rogue = ctx.socket(zmq.DEALER)
        rogue.setsockopt(zmq.LINGER, 0)
        rogue.connect(f"tcp://{c.base.servers[0]}")
        try:
            rogue.send_multipart(protocol.encode({**PUSH, "id": 1}, [np.ones(100, np.float32)]))
            if secret is None:
                assert _wait_for(lambda: _values(links)[0] == 0.0, 5.0), \
                    "control: without a secret the rogue push lands (else this oracle is blind)"
                return
            time.sleep(1.5)     # libzmq retries the handshake meanwhile, every ~0.1-0.2 s
        finally:
            rogue.close(0)
        np.testing.assert_array_equal(_values(links), 1.0)
        assert _requests_seen(links) == seen + 2    # the pull above and this stats, nothing else
    finally:
        links.close()


class _RecordingProxy:
    """A TCP proxy to ``target`` for one connection, keeping every chunk the client sent."""

    def __init__(self, target: str):
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.chunks: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def sent(self) -> bytes:
        return b"".join(self.chunks)

    def _run(self):
        client, _ = self.listener.accept()
        server = socket.create_connection(self.target)
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select([client, server], [], [], 0.1)
                for sock in ready:
                    data = sock.recv(1 << 16)
                    if not data:
                        return
                    if sock is client:
                        self.chunks.append(data)
                        server.sendall(data)
                    else:
                        client.sendall(data)
        finally:
            client.close()
            server.close()

    def close(self):
        self._stop.set()
        self._thread.join(5)
        self.listener.close()


def _replay(address: str, chunks: list[bytes]) -> None:
    """Play a recorded client's part of a conversation over a fresh TCP connection:
    each chunk as it was sent, after the server's answer to the previous one
    (as the real client did: libzmq drops a peer that sends data before the
    handshake is done). Returns when the server hangs up or all was sent."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.settimeout(0.2)
        try:
            for chunk in chunks:
                sock.sendall(chunk)
                try:
                    if not sock.recv(1 << 16):
                        return    # the server hung up
                except socket.timeout:
                    pass
            time.sleep(0.5)
        except OSError:
            return


@pytest.mark.parametrize("secret", [None, "s3cret"], ids=["control-plain", "curve"])
def test_a_recorded_client_stream_replayed_over_a_new_connection_has_no_effect(cluster, secret):
    c, links = _registered_job(cluster, secret)
    try:
        # A legitimate client, through a proxy that records what it sends: one push (w: 1 -> 0).
        proxy = _RecordingProxy(c.base.servers[0])
        try:
            with ServerLinks.for_job(c.trainer_env(0, servers=(proxy.address,))) as victim:
                victim.request(0, PUSH, [np.ones(100, np.float32)])
        finally:
            proxy.close()
        assert len(proxy.sent) > 400
        np.testing.assert_array_equal(_values(links), 0.0)
        assert (b"push_dense" in proxy.sent) == (secret is None)   # encrypted on the wire
        seen = _requests_seen(links)
        _replay(c.base.servers[0], proxy.chunks)
        if secret is None:
            assert _wait_for(lambda: _values(links)[0] == -1.0, 5.0), \
                "control: a plain stream replays (else this oracle is blind)"
            return
        np.testing.assert_array_equal(_values(links), 0.0)
        assert _requests_seen(links) == seen + 2    # the pull above and this stats, nothing replayed
    finally:
        links.close()


def test_a_refused_client_stops_knocking_and_cannot_wedge_the_process():
    """After HandshakeRefused the link stops reconnecting (a misconfigured trainer
    does not hammer the server), and monitor events can never fill up: libzmq's
    I/O thread would block on a full monitor pipe and every socket of the
    process's context would go silent."""
    from paramshard.transport.server_socket import bind_router
    from zmq.utils.monitor import recv_monitor_message
    right, wrong = Security.from_secret("s3cret", "job-a"), Security.from_secret("s3cret", "job-b")
    router, address = bind_router(zmq.Context.instance(), "127.0.0.1:0", "test", security=right)
    accepted = router.get_monitor_socket(zmq.EVENT_ACCEPTED)
    links = ServerLinks([address], 10, security=wrong)    # left open on purpose, as a failed Trainer() does
    try:
        assert links.links[0].monitor.getsockopt(zmq.RCVHWM) == 0
        with pytest.raises(HandshakeRefused):
            links.wait_ready(10)
        time.sleep(0.3)
        while accepted.poll(0):
            recv_monitor_message(accepted)
        time.sleep(1.5)    # libzmq would retry every ~0.1-0.2 s
        assert not accepted.poll(0), "the refused client is still reconnecting"
        with pytest.raises(HandshakeRefused):   # and asking again fails again, at once
            links.request(0, {"op": "hello"}, timeout=5)
    finally:
        links.close()
        router.disable_monitor()
        accepted.close(0)
        router.close(0)


def test_a_refusal_under_bounded_loss_recovery_fails_the_call_and_is_not_waited_out():
    """With a retry policy (bounded-loss recovery) a lost server is waited for and asked again; a
    server that refuses the handshake is not lost: the call fails with HandshakeRefused, saying
    which setting to fix (the retry path once took the refusal for a loss and failed on it)."""
    from paramshard.client.recovery import ServeAgain
    from paramshard.transport.server_socket import bind_router
    right, wrong = Security.from_secret("s3cret", "job-a"), Security.from_secret("s3cret", "job-b")
    router, address = bind_router(zmq.Context.instance(), "127.0.0.1:0", "test", security=right)
    links = ServerLinks([address], 10, security=wrong)
    links.retry = ServeAgain(10)
    try:
        with pytest.raises(HandshakeRefused, match=r"server 0 \(127\.0\.0\.1:\d+\).*PARAMSHARD_"):
            links.wait_ready(10)
        assert links.retry.waits == []      # nothing was waited for: a refusal is no loss
    finally:
        links.close()
        router.close(0)


# -- a fake server (a squatter's address in an open rendezvous store) -------------------
@pytest.mark.parametrize("fake", ["other-keys", "plain-tcp"])
def test_a_fake_server_fails_curvezmq_authentication_and_the_trainer_says_so(fake):
    """`paramshard run`'s stores are open: a squatter can publish its own address. With the
    job's (generated) secret, the trainer refuses it: only a holder of the job's server key
    completes the handshake. Oracle: the error says so, and not a request reached the fake."""
    keys = Security.from_secret("a guess", "job-a") if fake == "other-keys" else None
    squatter = ParameterServer(0, "127.0.0.1:0", num_trainers=1, timeout=5.0, security=keys)
    squatter.start()
    try:
        squatter.wait_ready()
        env = ps.env.ClusterEnv(role="trainer", servers=(squatter.address,), secret="generated", job_id="job-a",
                                timeout=30)
        start = time.monotonic()
        with pytest.raises(HandshakeRefused) as refused:
            Trainer(model(), ps.optim.SGD(lr=0.1), env=env)
        assert time.monotonic() - start < 10
        message = str(refused.value)
        assert f"server 0 ({squatter.address}): it failed CurveZMQ authentication" in message
        assert "it is not this job's server (a stale or fake address)" in message
        assert "\n" not in message
        if fake == "plain-tcp":
            assert "it speaks plain TCP and this process CurveZMQ" in message
        with ServerLinks([squatter.address], 10, security=keys) as links:
            assert links.request(0, {"op": "stats"})[0]["stats"]["requests"] == 1     # this one alone
    finally:
        squatter.close()
