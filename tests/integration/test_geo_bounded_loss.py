"""GEO mode with ``--recovery bounded-loss``: kill -9 one of two servers while two GEO trainers
(GeoBackends in threads, each with its own links and ServeAgain) send rounds; the launcher's
replica keeper restores it in place and the trainers go on, no rollback.

The oracle (docs/modes.md, GEO: bounded-loss): every value the servers hold equals the initial
one plus every push the trainers sent (a round goes in one push, or overlapped in pieces, each
under its own step), except the pushes the old server 1 answered after its last copy (their
part on server 1: the dense blocks and rows it holds). A push is lost there when the old server
answered it (the trainer had not waited for the replacement yet) and its step is past the step
the keeper restored for that trainer and stream. SGD lr=1 on the replicas and integer
gradients: every value pushed is a multiple of 1/4, exact in float32 whatever order the pushes
arrive in. Blocking and overlapped sends.
"""
from __future__ import annotations

import itertools
import os
import signal
import threading
import time

import numpy as np
import pytest
import torch

import paramshard as ps
from paramshard.client.sparse import TableSpec
from paramshard.placement.sparse_hash import server_of
from paramshard.launch.elastic.replica_keeper import ReplicaKeeper
from paramshard.trainer.backends.geo import GeoBackend
from tests.integration.bounded_loss_harness import _restart, _serving

# Starts, stops or kills server processes of its own: `make test` only, not `make check`.
pytestmark = pytest.mark.processes

TRAINERS, SERVERS, VICTIM, K, DIM, SIZE = 2, 2, 1, 2, 4, 400
SHARED = np.arange(1, 65, dtype=np.uint64)


class Pushes:
    """One GEO trainer's pushes as it sent them (a round goes in one push, or overlapped in pieces,
    each under a step number of its own): per push, its step, what it carried x4 (SGD lr=1 on
    integer gradients, halved: every value sent is a multiple of 1/4, exact in float32), dense
    and by row, and whether the old server 1 answered it: it did when its reply was taken before
    the trainer ever waited for the restored one. The push out when the first wait began
    straddles the kill: its part on server 1 may be lost or not, request by request (the test
    cannot see which). Pushes are answered in the order they were sent (StepClient)."""

    def __init__(self, backend: GeoBackend):
        self.backend = backend
        self.sent: list[tuple[int, np.ndarray | None, dict[int, np.ndarray], bool]] = []
        self.answered: list[float] = []          # when each push's reply was taken (monotonic)
        self.straddling: list[bool] = []         # the push out when the trainer first waited
        self._out: list[tuple] = []              # pushes not answered yet: (step, dense, rows, waits before)
        waits = backend.links.retry.waits
        steps = backend.servers.steps
        push, finish = steps.push, steps._finish_oldest

        def pushed(dense, sparse, step, values, **kw):
            w = (np.asarray(dense["w"], np.float64) * 4).round().astype(np.int64) if dense else None
            rows = {i: (np.asarray(g, np.float64) * 4).round().astype(np.int64)
                    for _, ids, grads in sparse for i, g in zip(ids.tolist(), grads)}
            self._out.append((step, w, rows, len(waits)))
            push(dense, sparse, step, values, **kw)

        def finished():
            step, w, rows, before = self._out.pop(0)
            finish()
            self.sent.append((step, w, rows, not waits))
            self.answered.append(time.monotonic())
            self.straddling.append(before == 0 and len(waits) > 0)
        steps.push, steps._finish_oldest = pushed, finished

    def step(self, rng, step: int, own: np.ndarray, values) -> None:
        ids = np.unique(np.concatenate([rng.choice(SHARED, 6, replace=False), rng.choice(own, 2)]))
        self.backend.rows("emb", ids, DIM, step, True)
        grad_w = rng.integers(-3, 4, SIZE)
        grad_rows = rng.integers(-3, 4, (len(ids), DIM))
        self.backend.push({"w": grad_w.astype(np.float32)}, [("emb", ids, grad_rows.astype(np.float32))], step,
                          values)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("send", ["blocking", "overlapped"])
def test_a_killed_server_loses_only_the_pushes_its_last_copy_missed(cluster, send):
    timeout = 15.0
    c = cluster(servers=SERVERS, trainers=TRAINERS, mode="geo", geo_k=K, timeout=timeout, min_block_size=64,
                recovery="bounded-loss", geo_send=send)
    addresses = list(c.base.servers)
    w0 = np.random.default_rng(7).integers(-50, 50, SIZE).astype(np.float32)
    spec = TableSpec("emb", DIM, ps.optim.SGD(lr=1.0), init_scale=0.0)
    plan_inputs = [("w", torch.nn.Parameter(torch.from_numpy(w0.copy())))]
    own = [np.arange(1000 + 100 * t, 1016 + 100 * t, dtype=np.uint64) for t in range(TRAINERS)]
    sgd = ps.optim.SGD(lr=1.0)
    registered, stop = threading.Event(), threading.Event()
    sides = [Pushes(GeoBackend.connect(c.trainer_env(t), params=plan_inputs)) for t in range(TRAINERS)]
    keeper: ReplicaKeeper | None = None
    errors: list[BaseException] = []

    def trainer(t: int):
        try:
            side = sides[t]
            values = {"w": w0.copy() if t == 0 else np.zeros(SIZE, np.float32)}
            if t:
                assert registered.wait(30)
            side.backend.start(values, sgd, {"emb": spec}, None, is_chief=t == 0)
            registered.set()
            rng, step = np.random.default_rng(100 + t), 0
            while not stop.is_set():
                side.step(rng, step, own[t], values)
                step += 1
            side.backend.flush()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)

    threads = [threading.Thread(target=trainer, args=(t,), daemon=True) for t in range(TRAINERS)]
    try:
        for th in threads:
            th.start()
        assert registered.wait(30)
        # One whole copy of each server, then none until the kill: the rounds server 1 applies in
        # the second between are lost (the keeper's copies run from the kill on, and restore it).
        keeper = ReplicaKeeper(addresses, timeout)
        for server in range(SERVERS):
            keeper.refresh(server)
        assert keeper.latest() and not errors, (errors, "the keeper made no whole copy")
        time.sleep(1.0)
        os.kill(c.children[VICTIM].pid, signal.SIGKILL)
        killed = time.monotonic()
        c.children[VICTIM].proc.wait(5)
        keeper.note_lost(VICTIM, killed)     # as the launcher does when it sees the server dead
        keeper.start()
        _restart(c, VICTIM)
        _serving(addresses[VICTIM], timeout)
        time.sleep(1.0)
        stop.set()
        for th in threads:
            th.join(timeout * 2)
        assert not errors, errors
        assert all(not th.is_alive() for th in threads), "a trainer thread hung"
    finally:
        stop.set()
        if keeper is not None:
            keeper.stop()
    assert len(keeper.restores) == 1, keeper.restores
    steps_of = {stream: dict(map(tuple, pairs)) for stream, pairs in keeper.restores[0]["steps"].items()}

    # The oracle, x4 in int64 (every value pushed is a multiple of 1/4). A push is lost on server 1
    # when the old server answered it (before the trainer ever waited) past the step the keeper
    # restored; the push out when the first wait began straddles the kill: its server-1 part is
    # either way, its dense request and its rows' request each (the old server may have answered
    # one and died before the other: all four are tried).
    plan = sides[0].backend.plan
    on_victim = np.zeros(SIZE, bool)
    for b in plan.for_server(VICTIM):
        on_victim[b.offset:b.offset + b.size] = True
    copy_age = keeper.restores[0]["copy_age_s"]
    straddling = [(t, r) for t, side in enumerate(sides) for r, flag in enumerate(side.straddling) if flag]

    def expected(lost_straddling: dict) -> tuple[np.ndarray, dict[int, np.ndarray], int, int]:
        """``lost_straddling``: (trainer, push) -> (whether its dense request was answered by the
        old server, whether its rows' request was): one may have been and the other not."""
        want_w = w0.astype(np.int64) * 4
        want_rows: dict[int, np.ndarray] = {}
        lost = lost_before = 0
        for t, side in enumerate(sides):
            for r, ((step, pushed_w, pushed_rows, old), at) in enumerate(zip(side.sent, side.answered)):
                dense_old, rows_old = lost_straddling.get((t, r), (old, old))
                dense_lost = dense_old and pushed_w is not None and step > steps_of.get("dense", {}).get(t, -1)
                rows_lost = rows_old and bool(pushed_rows) and step > steps_of.get("sparse:emb", {}).get(t, -1)
                if pushed_w is not None:       # the servers apply value - pushed (SGD lr=1)
                    want_w -= np.where(on_victim, 0, pushed_w) if dense_lost else pushed_w
                for i, g in pushed_rows.items():
                    mine = int(server_of(np.array([i], np.uint64), SERVERS)[0]) == VICTIM
                    want_rows[i] = want_rows.get(i, 0) - (0 if rows_lost and mine else g)
                lost += int(dense_lost or rows_lost)
                # The bound: only rounds the old server answered after its last copy (0.5 s of slack
                # for the copy's own time) are lost.
                lost_before += int((dense_lost or rows_lost) and at < killed - copy_age - 0.5)
        return want_w, want_rows, lost, lost_before

    held = {"w": np.full(SIZE, np.nan, np.float32)}
    sides[0].backend.servers.dense.pull_dense(held, 0)
    ids, rows, _ = sides[0].backend.servers.export_table("emb")
    held_rows = {i: row for i, row in zip(ids.tolist(), rows)}
    try:
        assert all(s.sent and s.sent[-1][3] is False for s in sides)     # each went on after the restore
        assert len(straddling) <= TRAINERS, straddling
        matches = []
        for choice in itertools.product(itertools.product((False, True), repeat=2), repeat=len(straddling)):
            want_w, want_rows, lost, lost_before = expected(dict(zip(straddling, choice)))
            if (np.array_equal(held["w"] * 4, want_w.astype(np.float32)) and sorted(held_rows) == sorted(want_rows)
                    and all(np.array_equal(held_rows[i] * 4, want_rows[i].astype(np.float32)) for i in want_rows)):
                matches.append((choice, lost, lost_before))
        print(f"\n{sum(len(s.sent) for s in sides)} pushes sent, straddling the kill {straddling}, "
              f"matches {matches} (restored copy {copy_age} s old)")
        want_w, want_rows, _, _ = expected({})
        assert matches, ("no account of the lost pushes gives what the servers hold",
                         "dense x4, held - expected:", {int(i): int(d) for i, d in enumerate(held["w"] * 4 - want_w)
                                                        if d},
                         {i: (held_rows.get(i) * 4, want_rows.get(i)) for i in want_rows
                          if i not in held_rows or not np.array_equal(held_rows[i] * 4, want_rows[i])})
        assert any(lost > 0 and lost_before == 0 for _, lost, lost_before in matches), (matches, copy_age)
    finally:
        for side in sides:
            side.backend.leave(10)
            side.backend.hang_up()
