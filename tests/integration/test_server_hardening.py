"""A live server against hostile or careless requests: every failure is an error
reply (with the request id), state is unchanged, and the server keeps serving."""
import time

import msgpack
import numpy as np
import pytest
import zmq

import paramshard as ps
from paramshard.client.dense import DenseClient
from paramshard.client.sparse import SparseClient, TableSpec
from paramshard.env import ClusterEnv
from paramshard.errors import ConfigError, RemoteError
from paramshard.limits import Limits
from paramshard.runtime import build_server
from paramshard.server.replies import Deferred, Reply
from paramshard.sharding import ParamSpec, make_plan
from paramshard.sparse_hash import initial_rows
from paramshard.transport import protocol
from paramshard.transport.client import ServerLinks


def start_server(mode="async", trainers=2, limits=Limits(), timeout=5.0):
    env = ClusterEnv(role="server", servers=("127.0.0.1:0",), server_id=0, num_trainers=trainers, mode=mode,
                     timeout=timeout, limits=limits)
    server = build_server(env, bind="127.0.0.1:0").start()
    server.wait_ready()
    return server


@pytest.fixture
def server():
    s = start_server()
    yield s
    s.close()


@pytest.fixture
def links(server):
    with ServerLinks([server.address], timeout=5) as lk:
        yield lk


def raw_request(address, header: dict, frames=(), timeout_ms=3000) -> dict:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://{address}")
    try:
        sock.send_multipart([msgpack.packb(header), *frames])
        assert sock.poll(timeout_ms), "the server did not answer"
        return msgpack.unpackb(sock.recv_multipart()[0])
    finally:
        sock.close(0)


def register_w(links, values=None):
    plan = make_plan([ParamSpec("w", (4,))], 1, min_block_size=1)
    client = DenseClient(links, plan, 0)
    client.register_dense({"w": np.zeros(4, np.float32) if values is None else values}, ps.optim.SGD(lr=1.0))
    return client


def pull_w(client):
    out = {"w": np.empty(4, np.float32)}
    client.pull_dense(out, 0)
    return out["w"]


# -- defect 1: any exception, immediate or deferred, is an error reply ----------
def test_a_crashing_deferred_reply_is_an_internal_error_and_the_server_keeps_serving(server, links):
    class Exploding:
        def ops(self):
            return {"stats": self.handle}    # borrow a schema-valid op

        def handle(self, header, arrays):
            def boom():
                raise MemoryError("simulated: no memory for the rows")
            return Deferred(ready=lambda: True, make_reply=boom, describe=lambda: "")

        def stats(self):
            return {}

        def on_leave(self, trainer):
            pass
    server._handlers["stats"] = Exploding().handle
    with pytest.raises(RemoteError, match=r"internal.*stats.*MemoryError"):
        links.request(0, {"op": "stats"})
    assert links.request(0, {"op": "hello"})[0]["ok"]


def test_a_negative_seed_on_the_wire_is_refused_and_the_server_survives(server, links):
    header = {"op": "register_sparse", "trainer": 0, "table": "t", "dim": 4, "seed": -1,
              "optimizer": ps.optim.SGD().to_wire(),
              "policy": {"min_count": 1, "probability": 1.0, "unseen_steps": 0, "init_scale": 0.01}}
    with pytest.raises(RemoteError, match="seed"):
        links.request(0, header)
    assert links.request(0, {"op": "hello"})[0]["ok"]


# -- defect 5: duplicate names and ids, unknown rows ---------------------------
def test_push_dense_naming_a_block_twice_is_refused(server, links):
    client = register_w(links)
    push = {"op": "push_dense", "names": ["w.block0", "w.block0"], "step": 0, "trainer": 0, "reply_values": False}
    with pytest.raises(RemoteError, match="more than once"):
        links.request(0, push, [np.ones(4, np.float32)] * 2)
    np.testing.assert_array_equal(pull_w(client), 0.0)


def test_sparse_pushes_with_repeated_or_unknown_ids(server, links):
    sparse = SparseClient(links, 0)
    sparse.register_sparse(TableSpec("t", 2, ps.optim.SGD(lr=1.0), init_scale=0.0))
    ids = np.array([1, 2], np.uint64)
    sparse.pull_sparse("t", ids, 2)
    push = {"op": "push_sparse", "table": "t", "step": 0, "trainer": 0}
    with pytest.raises(RemoteError, match="repeat"):
        links.request(0, {**push, "distinct": True}, [np.array([1, 1], np.uint64), np.ones((2, 2), np.float32)])
    with pytest.raises(RemoteError, match="never pulled"):
        links.request(0, push, [np.array([3], np.uint64), np.ones((1, 2), np.float32)])
    links.request(0, {**push, "distinct": False}, [np.array([1, 1], np.uint64), np.ones((2, 2), np.float32)])
    np.testing.assert_array_equal(sparse.pull_sparse("t", ids, 2), [[-2, -2], [0, 0]])


# -- defect 6: registration ------------------------------------------------------
def test_registration_is_all_or_nothing_and_only_the_chief_registers(server, links):
    plan = make_plan([ParamSpec("w", (4,)), ParamSpec("v", (4,))], 1, min_block_size=1)
    header = {"op": "register_dense", "trainer": 0, "names": [b.name for b in plan.blocks],
              "optimizer": ps.optim.SGD().to_wire(), "plan_fingerprint": plan.fingerprint()}
    with pytest.raises(RemoteError, match="float32"):
        links.request(0, header, [np.zeros(4, np.float32), np.zeros(4, np.float64)])
    links.request(0, header, [np.zeros(4, np.float32), np.zeros(4, np.float32)])     # the retry works
    fresh = {**header, "names": ["x.block0"], "plan_fingerprint": 1234}
    with pytest.raises(RemoteError, match="different model"):
        links.request(0, {**fresh, "trainer": 1}, [np.zeros(4, np.float32)])
    # the chief's plan still stands: a real trainer's pull works
    DenseClient(links, plan, 1).pull_dense({"w": np.empty(4, np.float32), "v": np.empty(4, np.float32)}, 0)


def test_pulling_an_unknown_block_after_registration_fails_at_once(server, links):
    client = register_w(links)
    header = {"op": "pull_dense", "names": ["nope.block0"], "min_version": 0, "trainer": 0,
              "plan_fingerprint": client.fingerprint}
    with pytest.raises(RemoteError, match="unknown blocks"):
        links.request(0, header, timeout=2.0)


# -- defect 7: limits --------------------------------------------------------------
def test_limits_are_enforced_with_errors_naming_them():
    server = start_server(limits=Limits(max_ids=100, max_dim=64, max_rows=150))
    try:
        with ServerLinks([server.address], timeout=5) as links:
            sparse = SparseClient(links, 0)
            with pytest.raises(RemoteError, match="PARAMSHARD_MAX_DIM"):
                sparse.register_sparse(TableSpec("big", 200000, ps.optim.SGD()))
            sparse.register_sparse(TableSpec("t", 4, ps.optim.SGD()))
            with pytest.raises(RemoteError, match="PARAMSHARD_MAX_IDS"):
                sparse.pull_sparse("t", np.arange(101, dtype=np.uint64), 4)
            sparse.pull_sparse("t", np.arange(100, dtype=np.uint64), 4)
            with pytest.raises(RemoteError, match="PARAMSHARD_MAX_ROWS"):
                sparse.pull_sparse("t", np.arange(100, 200, dtype=np.uint64), 4)
            assert server.snapshot_stats()["sparse_rows"] == 100
            with pytest.raises(RemoteError, match="rows reserved on this server.*PARAMSHARD_MAX_ROWS"):
                sparse.register_sparse(TableSpec("huge", 4, ps.optim.SGD(), capacity=10_000))
            assert "huge" not in server.snapshot_stats()["tables"]     # refused whole: no half table
    finally:
        server.close()


def test_a_capacity_hint_reserves_rows_up_front_and_the_table_still_grows():
    server = start_server()
    try:
        with ServerLinks([server.address], timeout=5) as links:
            sparse = SparseClient(links, 0)
            sparse.register_sparse(TableSpec("t", 4, ps.optim.Adagrad(lr=0.1), capacity=50_000))
            table = server._handlers["pull_sparse"].__self__.tables["t"]
            assert len(table.values) >= 50_000 and len(table.slots[0]) == len(table.values)
            assert table.num_rows == 0
            ids = np.arange(60_000, dtype=np.uint64)      # past the hint: it grows as before
            rows = sparse.pull_sparse("t", ids, 4)
            np.testing.assert_array_equal(rows, initial_rows(0, ids, 4, 0.01))
            assert table.num_rows == 60_000
        with pytest.raises(ConfigError, match="capacity must be a whole number"):
            TableSpec("t", 4, ps.optim.SGD(), capacity=-1)
    finally:
        server.close()


def test_an_oversized_message_is_dropped_before_it_is_buffered():
    server = start_server(limits=Limits(max_message_bytes=1 << 20))
    try:
        frames = [msgpack.packb({"v": 1, "id": 5, "op": "hello", "arrays": [{"dtype": "float32", "shape": [1 << 19]}]}),
                  b"\0" * (2 << 20)]
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(f"tcp://{server.address}")
        sock.send_multipart(frames)
        assert not sock.poll(1000), "an oversized message must be dropped unread, not answered"
        sock.close(0)
        assert server.stats["requests"] == 0
        with ServerLinks([server.address], timeout=5) as links:
            assert links.request(0, {"op": "hello"})[0]["ok"]
    finally:
        server.close()


def test_trainer_ids_outside_the_job_are_refused(server, links):
    with pytest.raises(RemoteError, match="not part of this job"):
        links.request(0, {"op": "pull_sparse", "table": "t", "trainer": 10**9, "min_version": 0},
                      [np.array([1], np.uint64)])


# -- defect 8: protocol strictness -------------------------------------------------
@pytest.mark.parametrize("header", [
    {"v": 1, "id": 41, "op": "hello", "arrays": "nope"},
    {"v": True, "id": 41, "op": "hello", "arrays": []},
    {"v": 1.0, "id": 41, "op": "hello", "arrays": []},
    {"v": 1, "id": 41, "op": "explode", "arrays": []},
    {"v": 1, "id": 41, "op": "pull_sparse", "table": "t", "trainer": 0, "min_version": 0, "create": "yes",
     "arrays": []},
])
def test_error_replies_carry_the_request_id(server, header):
    reply = raw_request(server.address, header)
    assert reply["ok"] is False and reply["id"] == 41


def test_a_bool_request_id_is_refused(server):
    reply = raw_request(server.address, {"v": 1, "id": True, "op": "hello", "arrays": []})
    assert reply["ok"] is False and reply["id"] == -1


def test_leave_for_an_unknown_trainer_is_an_error(server, links):
    with pytest.raises(RemoteError, match="not part of this job"):
        links.request(0, {"op": "leave", "trainer": 5})
    links.request(0, {"op": "leave", "trainer": 1})
    with pytest.raises(RemoteError, match="already left"):
        links.request(0, {"op": "leave", "trainer": 1})


def test_a_message_queued_before_a_hang_up_does_not_bring_the_trainer_back():
    """The disconnect event can reach the server before the last messages of the same
    connection: such a message must not count as the trainer reconnecting (it did
    not; a bounded wait for it would then hang until the timeout instead of failing)."""
    env = ClusterEnv(role="server", servers=("127.0.0.1:0",), server_id=0, num_trainers=2, mode="async",
                     timeout=30)
    server = build_server(env, bind="127.0.0.1:0")       # not started: the test plays its loop
    sock = zmq.Context.instance().socket(zmq.DEALER)
    try:
        sock.connect(f"tcp://{server.address}")
        barrier = {"v": protocol.PROTOCOL_VERSION, "op": "barrier", "arrays": [], "name": "b", "count": 1, "trainer": 1}
        sock.send_multipart([msgpack.packb({**barrier, "id": 1})])
        assert server._sock.poll(5000)
        server._handle(server._sock.recv_multipart(copy=False))      # trainer 1 is known on this connection
        sock.send_multipart([msgpack.packb({**barrier, "id": 2, "name": "c"})])
        sock.close(linger=1000)                                        # hangs up after its last request
        deadline = time.monotonic() + 5
        while 1 not in server.membership.failed:                      # the accept, then the disconnect
            assert time.monotonic() < deadline, "no disconnect event within 5 s"
            server._monitor.poll(100)
            server._note_disconnects()
        assert server._sock.poll(5000)
        server._handle(server._sock.recv_multipart(copy=False))      # the request sent before the hang-up
        assert 1 in server.membership.failed, "a message of a closed connection revived trainer 1"
    finally:
        sock.close(0)
        server._stop.set()
        server._sock.close(0)
        server._monitor.close(0)
        server._peers.close()
