"""paramshard.barrier(): no trainer goes on before every trainer that has not left got there
(server/services/trainer_barrier.py, client/control.py).

Oracles: every trainer leaves a barrier after the last one entered it (times on one
clock: the trainers are threads of this process with their own links, as processes
would have); after a barrier the chief reads every trainer's pushes, in async mode
with pushes in flight too (gradients do not depend on the values, so the servers must
hold exactly initial - lr * everything pushed, averaged per step in sync mode); a trainer that left does not hold the
others up; one that dies fails their wait within seconds, naming it; a bad barrier
request gets an error naming what is wrong and the server goes on serving.
"""
import io
import math
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch
import torch.nn as nn

import paramshard as ps
from paramshard.client import control
from paramshard.errors import DeadlineExceeded, RemoteError
from paramshard.launch.engines.local import child_environ
from paramshard.launch.engines.processes import Child
from paramshard.trainer.trainer import Trainer
from paramshard.transport.links import ServerLinks
from tests.conftest import run_in_threads

# Starts, stops or kills server processes of its own: `make test` only, not `make check`.
pytestmark = pytest.mark.processes

LR, FEATURES = 0.5, 6


class Linear(nn.Module):
    """loss = sum(w * x): the gradient is x, whatever w holds."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(FEATURES))

    def forward(self, x):
        return (self.w * x).sum()


def waiting(links, name):
    return links.request(0, {"op": "stats"})[0]["stats"]["barriers"]["waiting"].get(name)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_nobody_leaves_a_barrier_before_the_slowest_entered_it(cluster, mode):
    c = cluster(servers=2, trainers=3, mode=mode, timeout=10.0, min_block_size=2)
    delays = [[0.0, 0.3, 0.6], [0.6, 0.0, 0.3]]       # before barrier #1, #2: each trainer is last once
    rng = np.random.default_rng(0)
    data = [[torch.from_numpy(rng.integers(-3, 4, FEATURES).astype(np.float32)) for _ in range(12)]
            for _ in range(3)]
    times, seen = {}, {}

    def train(t):
        model = Linear()
        trainer = Trainer(model, ps.optim.SGD(lr=LR), env=c.trainer_env(t),
                          max_in_flight=3 if mode == "async" else None)
        for x in data[t]:
            trainer.step(model(x))
        for i, delay in enumerate(delays):
            time.sleep(delay[t])
            entered = time.monotonic()
            trainer.barrier("epoch")
            times[i, t] = entered, time.monotonic()
            assert trainer.steps.in_flight == 0      # its pushes were answered before it entered
            if i == 0 and t == 0:        # the chief reads the model while the others wait in #2
                trainer.pull()
                seen["w"] = model.w.detach().numpy().copy()
        assert trainer.barrier_counts() == {"epoch": 2}
        trainer.close()

    run_in_threads([lambda t=t: train(t) for t in range(3)], timeout=40)
    for i in range(len(delays)):
        last_in = max(times[i, t][0] for t in range(3))
        first_out = min(times[i, t][1] for t in range(3))
        assert first_out >= last_in, (i, times)
        assert max(times[i, t][1] for t in range(3)) - last_in < 3.0, (i, times)   # and promptly
    everything = sum(x for xs in data for x in xs).numpy()
    if mode == "sync":
        everything /= 3                  # a sync step averages the trainers' gradients
    np.testing.assert_allclose(seen["w"], -LR * everything, rtol=1e-6)


def test_a_trainer_that_left_does_not_hold_the_others(cluster):
    c = cluster(servers=1, trainers=3, mode="sync", timeout=10.0)
    out = {}

    def train(t):
        model = Linear()
        trainer = Trainer(model, ps.optim.SGD(lr=LR), env=c.trainer_env(t))
        trainer.step(model(torch.ones(FEATURES)))
        if t == 2:                      # done: leaves while the others wait in the barrier
            time.sleep(0.5)
            out["left"] = time.monotonic()
            trainer.close()
            return
        trainer.barrier("x")
        out[t] = time.monotonic()
        trainer.barrier("x")            # #2: trainer 2 is no longer waited for at all
        out[t, 2] = time.monotonic() - out[t]
        trainer.close()

    run_in_threads([lambda t=t: train(t) for t in range(3)], timeout=30)
    assert out[0] >= out["left"] and out[1] >= out["left"], out
    assert out[0, 2] < 2.0 and out[1, 2] < 2.0, out


KILLED = textwrap.dedent(f"""
    import time, torch, torch.nn as nn
    import paramshard as ps
    ps.init()
    trainer = ps.Trainer(nn.Linear({FEATURES}, 1), ps.optim.SGD(lr=0.1))
    print("ready", flush=True)
    time.sleep(120)
""")


def test_a_killed_trainer_fails_the_barrier_at_once_naming_it(cluster, tmp_path):
    # A server timeout far longer than the test: only the lost connection can end the wait.
    c = cluster(servers=1, trainers=3, mode="sync", timeout=60.0)
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    log = io.StringIO()
    child = Child("trainer 2", [sys.executable, str(script)], child_environ(c.trainer_env(2)), log)
    out = {}
    try:
        def train(t):
            trainer = Trainer(nn.Linear(FEATURES, 1), ps.optim.SGD(lr=0.1), env=c.trainer_env(t))
            try:
                trainer.barrier("epoch")
            except RemoteError as exc:
                out[t] = time.monotonic(), exc
            trainer.close()

        def kill():
            end = time.monotonic() + 30
            with ServerLinks(c.base.servers, timeout=10.0) as links:
                while (waiting(links, "epoch") or {}).get("missing") != [2] or "ready" not in log.getvalue():
                    assert time.monotonic() < end and child.poll() is None, log.getvalue()
                    time.sleep(0.05)
            out["killed"] = time.monotonic()
            os.kill(child.pid, 9)

        run_in_threads([lambda: train(0), lambda: train(1), kill], timeout=45)
    finally:
        child.stop(grace=1)
    for t in (0, 1):
        when, exc = out[t]
        assert when - out["killed"] < 5.0, (when - out["killed"], exc)
        assert exc.code == "peer_lost" and "trainers [2]" in str(exc) and "barrier 'epoch' #1" in str(exc), exc


STANDALONE = textwrap.dedent("""
    import time, torch, torch.nn as nn
    import paramshard as ps
    from paramshard.errors import ConfigError
    ps.init()
    try:
        ps.barrier()
        raise SystemExit("ps.barrier() without a Trainer did not fail")
    except ConfigError as exc:
        assert "build ps.Trainer(model) first" in str(exc), exc
    model = nn.Linear(4, 1)
    trainer = ps.Trainer(model, ps.optim.SGD(lr=0.1))
    trainer.step(model(torch.ones(2, 4)).sum())
    started = time.monotonic()
    ps.barrier(); ps.barrier(); ps.barrier("eval", timeout=30.0); trainer.barrier("eval")
    took = time.monotonic() - started
    assert took < 10, took    # a barrier that waited would wait out its 30 s
    assert trainer.barrier_counts() == {"default": 2, "eval": 2}, trainer.barrier_counts()
    trainer.close()
    try:
        ps.barrier()
        raise SystemExit("ps.barrier() after close() did not fail")
    except ConfigError:
        pass
    print("ok", flush=True)
""")


def test_one_process_with_an_in_process_server_passes_at_once(tmp_path):
    script = tmp_path / "alone.py"
    script.write_text(STANDALONE)
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("PARAMSHARD_", "OMPI_", "SLURM_", "PMI_")) and k not in ("RANK", "WORLD_SIZE")}
    done = subprocess.run([sys.executable, str(script)], env=environ, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr


BAD = [   # (header fields, reply code, part of the message)
    ({"trainer": 0, "count": 1}, "bad_request", "missing field 'name'"),
    ({"trainer": 0, "name": "b"}, "bad_request", "missing field 'count'"),
    ({"name": "b", "count": 1}, "bad_request", "missing field 'trainer'"),
    ({"trainer": 0, "name": 7, "count": 1}, "bad_request", "field 'name' must be str"),
    ({"trainer": 0, "name": "b", "count": "1"}, "bad_request", "field 'count' must be int"),
    ({"trainer": 0, "name": "b", "count": True}, "bad_request", "field 'count' must be int"),
    ({"trainer": 0, "name": "b", "count": 1.0}, "bad_request", "field 'count' must be int"),
    ({"trainer": "0", "name": "b", "count": 1}, "bad_request", "field 'trainer' must be int"),
    ({"trainer": 0, "name": "b", "count": -1}, "invalid", "counts start at 1"),
    ({"trainer": 0, "name": "b", "count": 0}, "invalid", "counts start at 1"),
    ({"trainer": 0, "name": "", "count": 1}, "invalid", "1 to 256 characters"),
    ({"trainer": 0, "name": "x" * 300, "count": 1}, "invalid", "1 to 256 characters"),
    ({"trainer": 7, "name": "b", "count": 1}, "invalid", "trainer 7 is not part of this job"),
    ({"trainer": 0, "name": "b", "count": 2}, "invalid", "skipped one?"),
    ({"trainer": 0, "name": "b", "count": 2**64 - 1}, "invalid", "skipped one?"),
]


def test_bad_barrier_requests_get_clear_errors_and_the_server_goes_on(cluster):
    c = cluster(servers=2, trainers=2, mode="sync", timeout=10.0)
    links = [ServerLinks(c.base.servers, timeout=10.0) for _ in range(2)]
    try:
        for link in links:
            link.wait_ready(30)

        def refused(t, fields, code, text, server=0, arrays=()):
            with pytest.raises(RemoteError) as caught:
                links[t].request(server, {"op": "barrier", **fields}, arrays)
            assert caught.value.code == code and text in caught.value.remote_message, (fields, caught.value)

        for fields, code, text in BAD:
            refused(0, fields, code, text)
        refused(0, {"trainer": 0, "name": "b", "count": 1}, "invalid", "barriers are kept by server 0 only", server=1)
        refused(0, {"trainer": 0, "name": "b", "count": 1}, "invalid", "carries no arrays",
                arrays=[np.zeros(2, np.float32)])
        assert waiting(links[0], "b") is None and links[0].request(0, {"op": "stats"})[0]["stats"]["barriers"] \
            == {"names": 0, "waiting": {}}        # nothing rejected left a trace

        def enter(t, name, count):
            return links[t].submit([(0, {"op": "barrier", "trainer": t, "name": name, "count": count}, ())])

        first = enter(0, "b", 1)
        refused(0, {"trainer": 0, "name": "b", "count": 2}, "invalid", "#1 still waits for trainers [1]")
        links[1].collect(enter(1, "b", 1))
        links[0].collect(first)
        links[0].collect(enter(0, "b", 1))       # a retry of the count that completed: answered at once
        both = [enter(0, "b", 2), enter(1, "b", 2)]
        for t in (0, 1):
            links[t].collect(both[t])
        refused(0, {"trainer": 0, "name": "b", "count": 1}, "invalid", "older than #2")
        refused(1, {"trainer": 1, "name": "b", "count": 4}, "invalid", "skipped one?")
        for link in links:
            assert link.request(0, {"op": "hello"})[0]["ok"]
        assert waiting(links[0], "b") is None
    finally:
        for link in links:
            link.close()


def test_a_barrier_outlasts_the_servers_timeout_and_a_deadline_names_who_is_missing(cluster):
    """Server 0 gives a waiting request up after PARAMSHARD_TIMEOUT (here 1 s); the client
    asks again until its own deadline, so a barrier may wait for a slow trainer longer."""
    c = cluster(servers=1, trainers=2, mode="sync", timeout=1.0)
    links = [ServerLinks(c.base.servers, timeout=1.0) for _ in range(2)]
    try:
        for link in links:
            link.wait_ready(30)
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded, match=r"barrier 'late' #1 did not complete within 2\.5 s.*trainers \[1\]"):
            control.barrier(links[0], 0, "late", 1, timeout=2.5)
        assert time.monotonic() - started < 6.0
        done = {}

        def slow():                          # enters 3 server timeouts later
            time.sleep(3.0)
            control.barrier(links[1], 1, "late", 1)
            done[1] = time.monotonic()

        def patient():                       # the retry of #1 that failed above, with no limit
            control.barrier(links[0], 0, "late", 1, timeout=math.inf)
            done[0] = time.monotonic()

        run_in_threads([slow, patient], timeout=20)
        assert abs(done[0] - done[1]) < 1.0, done
    finally:
        for link in links:
            link.close()
