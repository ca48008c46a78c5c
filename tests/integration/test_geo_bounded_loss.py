"""GEO mode with ``--recovery bounded-loss``: kill -9 one of two servers while two GEO trainers
(GeoBackends in threads, each with its own links and ServeAgain) send rounds; the launcher's
replica keeper restores it in place and the trainers go on, no rollback.

The oracle (docs/modes.md, GEO: bounded-loss): every value the servers hold equals the initial
one plus every round's delta the trainers sent, except the rounds the old server 1 answered
after its last copy (their part on server 1: the dense blocks and rows it holds). A round is
lost there when the old server answered its push (the trainer had not waited for the
replacement yet) and its step is past the step the keeper restored for that trainer and
stream. SGD lr=1 on the replicas and integer gradients: a round's delta is minus the sum of its
gradients / 2, exact in float32 whatever order the rounds arrive in.
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


class Rounds:
    """One GEO trainer's rounds as it sent them: per round, its step, the sum of its integer
    gradients (dense, and by row), and whether the old server 1 answered its push: it did when
    the round landed before the trainer ever waited for the restored one (an overlapped round
    lands a step or more after its send; a blocking one at once). The round on the wire when the
    first wait began straddles the kill: its part on server 1 may be lost or not, request by
    request (the test cannot see which)."""

    def __init__(self, backend: GeoBackend):
        self.backend = backend
        self.sent: list[tuple[int, np.ndarray, dict[int, np.ndarray], bool]] = []
        self.answered: list[float] = []          # when each round went out (monotonic): its answer came later
        self.straddling: list[bool] = []         # the round on the wire when the trainer first waited
        self.grad_w, self.grad_rows = np.zeros(SIZE, np.int64), {}
        self._out: tuple | None = None           # the round on the wire: (step, grads, rows, waits before it)
        waits = backend.links.retry.waits
        send_round = backend.send_round

        def sent(step: int) -> None:
            if backend.steps_in_round:
                self._out = (step, self.grad_w, self.grad_rows, len(waits))
                self.answered.append(time.monotonic())
                self.grad_w, self.grad_rows = np.zeros(SIZE, np.int64), {}
            send_round(step)
        backend.send_round = sent

        def landed(done, next_k, step) -> None:
            at, grad_w, grad_rows, before = self._out
            assert at == step, (at, step)
            self.sent.append((step, grad_w, grad_rows, not waits))
            self.straddling.append(before == 0 and len(waits) > 0)
            self._out = None
        backend.on_round = landed

    def step(self, rng, step: int, own: np.ndarray, values) -> None:
        ids = np.unique(np.concatenate([rng.choice(SHARED, 6, replace=False), rng.choice(own, 2)]))
        self.backend.rows("emb", ids, DIM, step, True)
        grad_w = rng.integers(-3, 4, SIZE)
        grad_rows = rng.integers(-3, 4, (len(ids), DIM))
        self.grad_w += grad_w       # before the push: the k-th step's push ends the round
        for i, r in zip(ids.tolist(), grad_rows):
            self.grad_rows[i] = self.grad_rows.get(i, 0) + r
        self.backend.push({"w": grad_w.astype(np.float32)}, [("emb", ids, grad_rows.astype(np.float32))], step,
                          values)


@pytest.mark.timeout(120)
def test_a_killed_server_loses_only_the_rounds_its_last_copy_missed(cluster):
    timeout = 15.0
    c = cluster(servers=SERVERS, trainers=TRAINERS, mode="geo", geo_k=K, timeout=timeout, min_block_size=64,
                recovery="bounded-loss")
    addresses = list(c.base.servers)
    w0 = np.random.default_rng(7).integers(-50, 50, SIZE).astype(np.float32)
    spec = TableSpec("emb", DIM, ps.optim.SGD(lr=1.0), init_scale=0.0)
    plan_inputs = [("w", torch.nn.Parameter(torch.from_numpy(w0.copy())))]
    own = [np.arange(1000 + 100 * t, 1016 + 100 * t, dtype=np.uint64) for t in range(TRAINERS)]
    sgd = ps.optim.SGD(lr=1.0)
    registered, stop = threading.Event(), threading.Event()
    sides = [Rounds(GeoBackend.connect(c.trainer_env(t), params=plan_inputs)) for t in range(TRAINERS)]
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

    # The oracle, x2 (n = 2) in int64. A round is lost on server 1 when the old server answered
    # its push (before the trainer ever waited) past the step the keeper restored; the round whose
    # push first waited straddles the kill: its server-1 part is either way (both are tried).
    plan = sides[0].backend.plan
    on_victim = np.zeros(SIZE, bool)
    for b in plan.for_server(VICTIM):
        on_victim[b.offset:b.offset + b.size] = True
    copy_age = keeper.restores[0]["copy_age_s"]
    straddling = [(t, r) for t, side in enumerate(sides) for r, flag in enumerate(side.straddling) if flag]

    def expected(lost_straddling: set) -> tuple[np.ndarray, dict[int, np.ndarray], int, int]:
        want_w = w0.astype(np.int64) * TRAINERS
        want_rows: dict[int, np.ndarray] = {}
        lost = lost_before = 0
        for t, side in enumerate(sides):
            for r, ((step, grad_w, grad_rows, old), at) in enumerate(zip(side.sent, side.answered)):
                by_old = old or (t, r) in lost_straddling
                dense_lost = by_old and step > steps_of.get("dense", {}).get(t, -1)
                rows_lost = by_old and step > steps_of.get("sparse:emb", {}).get(t, -1)
                want_w -= np.where(on_victim, 0, grad_w) if dense_lost else grad_w
                for i, g in grad_rows.items():
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
        for choice in itertools.product((False, True), repeat=len(straddling)):
            want_w, want_rows, lost, lost_before = expected({tr for tr, x in zip(straddling, choice) if x})
            if (np.array_equal(held["w"] * TRAINERS, want_w.astype(np.float32)) and sorted(held_rows) == sorted(want_rows)
                    and all(np.array_equal(held_rows[i] * TRAINERS, want_rows[i].astype(np.float32)) for i in want_rows)):
                matches.append((choice, lost, lost_before))
        print(f"\n{sum(len(s.sent) for s in sides)} rounds sent, straddling the kill {straddling}, "
              f"matches {matches} (restored copy {copy_age} s old)")
        want_w, want_rows, _, _ = expected(set())
        assert matches, ("no account of the lost rounds gives what the servers hold",
                         {i: (held_rows.get(i), want_rows.get(i)) for i in want_rows
                          if i not in held_rows or not np.array_equal(held_rows[i] * TRAINERS, want_rows[i])})
        assert any(lost > 0 and lost_before == 0 for _, lost, lost_before in matches), (matches, copy_age)
    finally:
        for side in sides:
            side.backend.leave(10)
            side.backend.hang_up()
