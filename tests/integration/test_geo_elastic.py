"""GEO mode in an elastic job (``--trainers MIN:MAX``), on servers that are threads of the test
process: a trainer leaves with a round in progress, one is killed with one, another joins the
running job, and the exact-sum oracle still holds (docs/modes.md, GEO: elastic trainers).

Four trainer slots (n = 4: a round's change is divided by the job's slots, whoever runs), SGD
lr=1 and integer gradients: every delta is a multiple of 1/4, so every sum is exact in float32
whatever order the rounds arrive in.
"""
from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np
import torch

import paramshard as ps
from paramshard.client.sparse import TableSpec
from paramshard.trainer.backends.geo import GeoBackend
from tests.conftest import run_in_threads

SLOTS, K, DIM, SIZE, STEPS = 4, 3, 4, 300, 10      # STEPS % K != 0: the leaver has a round in progress
KILLED_STEPS = 5                                    # trainer 3 is killed with 5 % K steps unsent
SHARED = np.arange(1, 17, dtype=np.uint64)
NONE = np.zeros(DIM, np.int64)                      # a row no round sent anything for: init_scale 0


class Side:
    """One trainer's GeoBackend and what it sent, counted by rounds when they go out (an
    overlapped round lands later, with steps of the next one trained): the sum of the integer
    gradients of its rounds sent (dense, and by row), and each round's (steps, trainer step)."""

    def __init__(self, env, plan_inputs, spec):
        self.backend = GeoBackend.connect(env, params=plan_inputs)
        self.rounds: list[tuple[int, int]] = []
        send_round = self.backend.send_round

        def counted(step: int) -> None:
            if self.backend.steps_in_round:
                self._sent(self.backend.steps_in_round, step)
            send_round(step)
        self.backend.send_round = counted
        self.spec = spec
        self.grad_w = np.zeros(SIZE, np.int64)                  # of the rounds sent
        self.grad_rows: dict[int, np.ndarray] = {}
        self.round_w, self.round_rows = np.zeros(SIZE, np.int64), {}     # of the round in progress
        self.values = {"w": np.zeros(SIZE, np.float32)}

    def _sent(self, steps: int, step: int) -> None:
        self.rounds.append((steps, step))
        self.grad_w += self.round_w
        for i, g in self.round_rows.items():
            self.grad_rows[i] = self.grad_rows.get(i, 0) + g
        self.round_w, self.round_rows = np.zeros(SIZE, np.int64), {}

    def train(self, rng, first_step: int, steps: int, own: np.ndarray) -> None:
        for step in range(first_step, first_step + steps):
            ids = np.unique(np.concatenate([rng.choice(SHARED, 5, replace=False), rng.choice(own, 2)]))
            self.backend.rows("emb", ids, DIM, step, True)
            grad_w = rng.integers(-3, 4, SIZE).astype(np.float32)
            grad_rows = rng.integers(-3, 4, (len(ids), DIM)).astype(np.float32)
            self.round_w += grad_w.astype(np.int64)         # before the push: the k-th ends the round
            for i, r in zip(ids.tolist(), grad_rows.astype(np.int64)):
                self.round_rows[i] = self.round_rows.get(i, 0) + r
            self.backend.push({"w": grad_w}, [("emb", ids, grad_rows)], step, self.values)


def _held(backend) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """What the servers hold now: the dense block and every row."""
    held = {"w": np.empty(SIZE, np.float32)}
    backend.servers.dense.pull_dense(held, 0)
    ids, rows, _ = backend.servers.export_table("emb")
    return held["w"], {i: r for i, r in zip(ids.tolist(), rows)}


def _expected(w0, sides) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """x4 of what the servers must hold: initial values minus every gradient (each round sent
    its change / 4, and SGD lr=1 made the change minus the gradients)."""
    w = w0.astype(np.int64) * SLOTS - sum(s.grad_w for s in sides)
    rows: dict[int, np.ndarray] = {}
    for s in sides:
        for i, g in s.grad_rows.items():
            rows[i] = rows.get(i, 0) - g
    return w, rows


def test_a_join_a_leave_and_a_kill_keep_the_exact_sum(cluster):
    """Trainers 0, 1 and 3 train (K=3); trainer 1 leaves with 1 step unsent, which its leave
    sends; trainer 3 is killed (hangs up) with 2 steps unsent, which are lost; trainer 2 joins
    the running job and starts from the merged values; trainers 0 and 2 train 10 more. The
    servers end at initial - every gradient of every round sent / 4, dense and rows, and every
    local step of every trainer but the killed one's last 2 is in exactly one round."""
    c = cluster(servers=2, trainers=SLOTS, mode="geo", geo_k=K, min_block_size=64, min_trainers=1)
    w0 = np.random.default_rng(7).integers(-50, 50, SIZE).astype(np.float32)
    spec = TableSpec("emb", DIM, ps.optim.SGD(lr=1.0), init_scale=0.0)
    plan_inputs = [("w", torch.nn.Parameter(torch.from_numpy(w0.copy())))]
    own = [np.arange(100 + 100 * t, 108 + 100 * t, dtype=np.uint64) for t in range(SLOTS)]
    sides = {t: Side(c.trainer_env(t), plan_inputs, spec) for t in (0, 1, 3)}
    registered, joined = threading.Event(), threading.Event()
    sgd = ps.optim.SGD(lr=1.0)

    def chief():
        s = sides[0]
        s.values["w"][...] = w0
        s.backend.start(s.values, sgd, {"emb": spec}, None, is_chief=True)
        registered.set()
        s.train(np.random.default_rng(100), 0, STEPS, own[0])
        s.backend.flush()
        phase_a.wait()                      # trainer 1 left: its last round is on the servers
        assert joined.wait(60), "trainer 2 did not join"
        s.train(np.random.default_rng(200), STEPS, STEPS, own[0])
        s.backend.flush()

    def leaver():
        s = sides[1]
        assert registered.wait(30)
        s.backend.start(s.values, sgd, {"emb": spec}, None, is_chief=False)
        s.train(np.random.default_rng(101), 0, STEPS, own[1])
        assert s.backend.steps_in_round == STEPS % K       # a round in progress ...
        s.backend.leave(10)                                 # ... sent by the leave
        s.backend.hang_up()
        phase_a.wait()

    def killed():
        s = sides[3]
        assert registered.wait(30)
        s.backend.start(s.values, sgd, {"emb": spec}, None, is_chief=False)
        s.train(np.random.default_rng(103), 0, KILLED_STEPS, own[3])
        # Killed once the servers have its last round sent (overlapped, its merge may not have
        # landed: then it never does); a kill while a round is on the wire loses it or not.
        deadline = time.monotonic() + 30
        while not s.backend.servers.steps.pushes_answered():
            assert time.monotonic() < deadline, "trainer 3's last round got no answer in 30 s"
            time.sleep(0.01)
        s.backend.hang_up()          # as a kill: no flush, no leave; its round in progress is lost
        phase_a.wait()

    def joiner():
        phase_a.wait()                      # after trainer 1 left, while trainer 0 waits
        env = dataclasses.replace(c.trainer_env(2), joining=True)
        s = sides[2] = Side(env, plan_inputs, spec)
        first = s.backend.start(s.values, sgd, {"emb": spec}, None, is_chief=False)
        # It starts from the merged values: every round of trainers 0 and 1 so far is in them.
        w, rows = _held(s.backend)
        expected_w, expected_rows = _expected(w0, [sides[0], sides[1], sides[3]])
        np.testing.assert_array_equal(s.values["w"], w)
        np.testing.assert_array_equal(s.values["w"] * SLOTS, expected_w.astype(np.float32))
        ids = np.array(sorted(rows), np.uint64)
        np.testing.assert_array_equal(s.backend.rows("emb", ids, DIM, first, True) * SLOTS,
                                      np.stack([expected_rows.get(i, NONE) for i in ids.tolist()]).astype(np.float32))
        joined.set()
        s.train(np.random.default_rng(102), first, STEPS, own[2])
        s.backend.flush()

    phase_a = threading.Barrier(4, timeout=60)
    try:
        run_in_threads([chief, leaver, killed, joiner], timeout=120)
        w, rows = _held(sides[0].backend)
        expected_w, expected_rows = _expected(w0, sides.values())
        np.testing.assert_array_equal(w * SLOTS, expected_w.astype(np.float32))
        # Rows the killed trainer pulled but sent nothing for are held with their initial zeros.
        assert set(expected_rows) <= set(rows)
        for i, row in rows.items():
            np.testing.assert_array_equal(row * SLOTS, expected_rows.get(i, NONE).astype(np.float32),
                                          err_msg=f"row {i}")
        steps = {0: 2 * STEPS, 1: STEPS, 2: STEPS, 3: KILLED_STEPS // K * K}     # 3: its sent rounds
        for t, side in sides.items():          # every local step in one round, none over K
            assert sum(n for n, _ in side.rounds) == steps[t] and all(n <= K for n, _ in side.rounds), (t, side.rounds)
        assert sides[1].rounds[-1][0] == STEPS % K       # the leaver's last round: the one in progress
        assert 0 < KILLED_STEPS % K < K and sides[3].round_w.any()    # the killed one lost its unsent steps
    finally:
        for t in (0, 2):
            if t in sides:
                sides[t].backend.leave(10)
                sides[t].backend.hang_up()
