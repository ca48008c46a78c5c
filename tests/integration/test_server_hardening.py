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
from paramshard.server.assembly import build_server
from paramshard.server.core.replies import Deferred, Reply
from paramshard.placement.sharding import ParamSpec, make_plan
from paramshard.placement.sparse_hash import initial_rows
from paramshard.transport import protocol
from paramshard.transport.links import ServerLinks

# Starts, stops or kills server processes of its own: `make test` only, not `make check`.
pytestmark = pytest.mark.processes


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


# -- issue 20, defect 8: restore_sparse's row reservation ------------------------------
def test_restore_sparse_checks_its_reserve_before_allocating(server, links):
    sparse = SparseClient(links, 0)
    sparse.register_sparse(TableSpec("t", 4, ps.optim.SGD()))
    restore = {"op": "restore_sparse", "table": "t", "parts": ["ids", "values"], "version": 0, "evicted": 0,
               "trainer": 0}
    page = [np.array([7], np.uint64), np.ones((1, 4), np.float32)]
    with pytest.raises(RemoteError, match=r"invalid.*table 't'.*reserved.*PARAMSHARD_MAX_ROWS"):
        links.request(0, {**restore, "reserve": 2**40}, page)      # was an `internal` MemoryError
    with pytest.raises(RemoteError, match="reserve must be >= 0"):
        links.request(0, {**restore, "reserve": -1}, page)
    assert server.snapshot_stats()["sparse_rows"] == 0
    links.request(0, {**restore, "reserve": 10}, page)                 # a sane hint still works
    np.testing.assert_array_equal(sparse.pull_sparse("t", np.array([7], np.uint64), 4), np.ones((1, 4)))


# -- issue 20, defects 3 and 4: clients that do not read their replies -------------------
def snapshot_request(i: int) -> bytes:
    return msgpack.packb({"v": protocol.PROTOCOL_VERSION, "id": i, "op": "snapshot_dense", "arrays": []})


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def non_reader(address, security=None) -> zmq.Socket:
    """A DEALER that reads nothing: its libzmq takes one reply off TCP, the kernel a few MB more."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 1)
    sock.setsockopt(zmq.RCVBUF, 1 << 16)
    if security is not None:
        security.configure_client(sock)
    sock.connect(f"tcp://{address}")
    return sock


def register_model(links, elements: int) -> None:
    plan = make_plan([ParamSpec("w", (elements,))], 1)
    DenseClient(links, plan, 0).register_dense({"w": np.ones(elements, np.float32)}, ps.optim.SGD(lr=0.1))


def wait_for_stat(read_stats, key: str, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        stats = read_stats()
        if stats.get(key, 0) > 0:
            return stats
        assert time.monotonic() < deadline, f"no {key} within {timeout} s: {stats}"
        time.sleep(0.05)


def test_the_server_socket_never_stops_reading_a_connection():
    """libzmq 4.3.5 aborts the process when a peer resets a connection it stopped reading (inbound
    pipe at RCVHWM): the server's socket has no inbound limit, so it never stops reading."""
    from paramshard.transport.server_socket import bind_router
    sock, _ = bind_router(zmq.Context.instance(), "127.0.0.1:0", "test")
    try:
        assert sock.getsockopt(zmq.RCVHWM) == 0
    finally:
        sock.close(0)


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "curve"])
def test_a_client_that_floods_big_requests_and_hangs_up_does_not_abort_the_server(cluster, secure):
    """3000 snapshot_dense of a 4 MB model, then a reset: the server used to die in libzmq
    (`Assertion failed: !_io_error (src/stream_engine_base.cpp:310)`) within a heartbeat."""
    from paramshard.transport.security import Security
    c = cluster(servers=1, trainers=1, mode="sync", timeout=10.0,
                **({"secret": "issue-20", "job_id": "j"} if secure else {}))
    child, address, security = c.children[0], c.base.servers[0], Security.from_env(c.base)
    with ServerLinks([address], timeout=10, security=security) as links:
        links.wait_ready(30)
        register_model(links, 1 << 20)
        sock = non_reader(address, security)
        for i in range(3000):
            sock.send(snapshot_request(i))
        sock.close(0)
        # The abort came within a heartbeat interval (1 s) of the reset: keep being served for two.
        until = time.monotonic() + 2.0
        while time.monotonic() < until:
            assert child.proc.poll() is None, f"the server died: {child.describe_exit()}"
            assert links.request(0, {"op": "hello"}, timeout=5)[0]["ok"]
        assert child.proc.poll() is None, f"the server died: {child.describe_exit()}"


def test_a_client_that_never_reads_costs_the_server_a_bounded_amount_of_memory(cluster):
    limit, model = 32 << 20, 4 << 20
    c = cluster(servers=1, trainers=1, mode="sync", timeout=10.0, limits=Limits(max_queued_bytes=limit))
    child, address = c.children[0], c.base.servers[0]
    with ServerLinks([address], timeout=10) as links:
        links.wait_ready(30)
        register_model(links, model // 4)
        before = peak = rss_kb(child.pid)
        sock = non_reader(address)
        try:
            for i in range(3000):
                sock.send(snapshot_request(i))

            def read_stats():
                nonlocal peak
                peak = max(peak, rss_kb(child.pid))
                return links.request(0, {"op": "stats"})[0]["stats"]
            stats = wait_for_stat(read_stats, "requests_refused")
            peak = max(peak, rss_kb(child.pid))
            print(f"server VmRSS {before} kB before, peak {peak} kB with the non-reader: "
                  f"+{(peak - before) // 1024} MB; {stats['requests_held']} held, {stats['requests_refused']} refused")
            # Old code: up to SNDHWM (1000) snapshots, 4 GB. Now: the limit, one reply, allocator slack.
            assert (peak - before) * 1024 < limit + 2 * model + (48 << 20)
            assert stats["queued_reply_bytes"] <= limit + model
            assert links.request(0, {"op": "hello"})[0]["ok"]          # the others are served meanwhile
        finally:
            sock.close(0)


def slow_reader_server(timeout: float, **limits):
    server = start_server(limits=Limits(**limits), timeout=timeout)
    links = ServerLinks([server.address], timeout=5)
    register_model(links, 1 << 18)      # 1 MB replies: far more than the limit, and than TCP buffers hold
    return server, links


def test_a_slow_reader_is_held_back_and_then_served_never_refused():
    server, links = slow_reader_server(timeout=30.0, max_queued_bytes=2 << 20)
    sock = non_reader(server.address)
    try:
        for i in range(200):
            sock.send(snapshot_request(i))
        wait_for_stat(server.snapshot_stats, "requests_held")
        ids = []
        for _ in range(200):
            assert sock.poll(5000), f"no reply after {len(ids)}"
            reply = msgpack.unpackb(sock.recv_multipart()[0])
            assert reply["ok"], reply
            ids.append(reply["id"])
        assert ids == list(range(200))                      # in order, every one answered
        assert server.stats["requests_refused"] == 0
    finally:
        sock.close(0)
        links.close()
        server.close()


def test_a_request_held_past_the_timeout_is_refused_naming_the_limit():
    server, links = slow_reader_server(timeout=2.0, max_queued_bytes=2 << 20)
    sock = non_reader(server.address)
    try:
        for i in range(50):
            sock.send(snapshot_request(i))
        wait_for_stat(server.snapshot_stats, "requests_refused", timeout=10)   # held 2 s, the server's timeout
        deadline = time.monotonic() + 10
        while True:
            assert time.monotonic() < deadline and sock.poll(5000), "no refusal arrived"
            reply = msgpack.unpackb(sock.recv_multipart()[0])
            if not reply["ok"]:
                break
        assert reply["code"] == "overloaded"
        assert "PARAMSHARD_MAX_QUEUED_BYTES=2097152" in reply["message"] and "not read" in reply["message"]
        assert 0 <= reply["id"] < 50
        assert links.request(0, {"op": "hello"})[0]["ok"]
    finally:
        sock.close(0)
        links.close()
        server.close()


def test_a_trainer_with_requests_in_flight_is_never_refused_even_under_a_one_byte_limit():
    """A real trainer pipelines (pushes in flight, prefetches) and reads every reply: whatever
    the limit, its requests at most wait for its own replies to leave."""
    server = start_server(limits=Limits(max_queued_bytes=1))
    try:
        with ServerLinks([server.address], timeout=5) as links:
            client = register_w(links, np.ones(4, np.float32))
            pull = {"op": "pull_dense", "names": ["w.block0"], "min_version": 0, "trainer": 0,
                    "plan_fingerprint": client.fingerprint}
            push = {"op": "push_dense", "names": ["w.block0"], "trainer": 0, "reply_values": True}
            for step in range(20):
                in_flight = links.submit([(0, {**push, "step": step}, [np.ones(4, np.float32)])])
                prefetch = links.submit([(0, pull, ())] * 3)
                assert all(h["ok"] for h, _ in links.collect(prefetch) + links.collect(in_flight))
            stats = links.request(0, {"op": "stats"})[0]["stats"]
            assert stats.get("requests_refused", 0) == 0 and stats["requests_held"] > 0
            np.testing.assert_array_equal(pull_w(client), 1.0 - 20.0)
    finally:
        server.close()
