"""A hung server (SIGSTOP: alive, port open, never answering) fails the waiting
trainer within seconds, every time.

The stopped process's kernel still completes TCP handshakes, so libzmq
reconnects ~0.1 s after the heartbeat timeout closed the link: a reconnect must
not hide the loss of the connection the request went out on.
"""
import os
import random
import signal
import threading
import time

import pytest

from paramshard.errors import ServerUnavailable
from paramshard.transport.client import ServerLinks

TRIALS = 6
LIMIT_S = 10.0


def _stop_at_random_while_requesting(pid: int, address: str, rng: random.Random) -> float:
    """Requests back to back (with random pauses) while the server is SIGSTOPped
    at a random moment; seconds from the stop to ServerUnavailable."""
    # A deadline past the limit: a missed loss shows as DeadlineExceeded, not a pass.
    with ServerLinks([address], timeout=LIMIT_S + 2, who="trainer 0") as links:
        links.wait_ready(10)
        stopped_at = []

        def stop():
            os.kill(pid, signal.SIGSTOP)
            stopped_at.append(time.monotonic())

        timer = threading.Timer(rng.uniform(0.05, 1.5), stop)
        timer.start()
        try:
            with pytest.raises(ServerUnavailable, match=r"server 0 \(127\.0\.0\.1:\d+\)"):
                while True:
                    links.request(0, {"op": rng.choice(["hello", "stats"])})
                    if rng.random() < 0.5:
                        time.sleep(rng.uniform(0, 0.05))   # sometimes the stop lands between requests
        finally:
            timer.cancel()
            timer.join()
        return time.monotonic() - stopped_at[0]


def test_a_stopped_server_is_reported_within_seconds_every_time(cluster):
    c = cluster(servers=1, trainers=1, timeout=30.0)
    pid = c.children[0].pid
    rng = random.Random(int.from_bytes(os.urandom(4), "little"))
    took = []
    try:
        for _ in range(TRIALS):
            try:
                took.append(_stop_at_random_while_requesting(pid, c.base.servers[0], rng))
            finally:
                os.kill(pid, signal.SIGCONT)
    finally:
        # Never leave a stopped process behind, whatever failed above.
        if c.children[0].poll() is None:
            os.kill(pid, signal.SIGCONT)
    print("seconds from SIGSTOP to ServerUnavailable:", [round(t, 2) for t in took])
    assert max(took) < LIMIT_S, f"seconds from SIGSTOP to ServerUnavailable: {took}"


def test_a_server_stopped_between_requests_fails_the_next_one(cluster):
    c = cluster(servers=1, trainers=1, timeout=30.0)
    pid = c.children[0].pid
    try:
        with ServerLinks([c.base.servers[0]], timeout=LIMIT_S + 2, who="trainer 0") as links:
            links.wait_ready(10)
            os.kill(pid, signal.SIGSTOP)
            time.sleep(6.5)     # past the heartbeat timeout: libzmq has closed and reconnected
            start = time.monotonic()
            with pytest.raises(ServerUnavailable, match=r"server 0 \(127\.0\.0\.1:\d+\)"):
                links.request(0, {"op": "hello"})
            assert time.monotonic() - start < 3
    finally:
        os.kill(pid, signal.SIGCONT)
