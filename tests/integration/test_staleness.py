"""Async staleness: recorded per push, bounded by --max-staleness (SSP).

Oracles: with one trainer, a bound of 0 computes exactly what sync mode computes;
with trainers of different speeds, a bound of K never records a staleness above
K on any server, while the same run without a bound does (so the check can fail).
"""
import time

import numpy as np
import torch
import torch.nn as nn

import paramshard as ps
from paramshard.trainer.trainer import Trainer
from tests.conftest import run_in_threads

STEPS = 30


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(64, 32))      # two blocks at min_block_size 1024
        self.emb = ps.SparseEmbedding("t", 4, optimizer=ps.optim.SGD(lr=0.1))


def train(env, tid: int, sleep: float = 0.0, steps: int = STEPS, **kw):
    torch.manual_seed(0)
    model = Model()
    trainer = Trainer(model, ps.optim.SGD(lr=0.1), env=env, **kw)
    rng = np.random.default_rng(tid)
    for k in range(steps):
        x = torch.from_numpy(rng.normal(size=(8, 64)).astype(np.float32))
        ids = torch.from_numpy(rng.integers(0, 20, (8, 2)))
        loss = ((x @ model.w).sum(1) - 1).pow(2).mean() + model.emb(ids).pow(2).sum()
        trainer.step(loss)
        time.sleep(sleep)
    trainer.pull()
    values = model.w.detach().clone()
    return trainer, values


def staleness_max(trainer) -> int:
    seen = [int(k) for s in trainer.server_stats() for k, n in (s.get("staleness") or {}).items() if n]
    return max(seen) if seen else -1


def test_bound_zero_with_one_trainer_equals_sync(cluster):
    sync = cluster(servers=2, trainers=1, mode="sync", min_block_size=1024)
    bounded = cluster(servers=2, trainers=1, mode="async", min_block_size=1024, max_staleness=0)
    free = cluster(servers=2, trainers=1, mode="async", min_block_size=1024)
    t_sync, w_sync = train(sync.trainer_env(0), 0)
    t_bound, w_bound = train(bounded.trainer_env(0), 0)
    t_free, w_free = train(free.trainer_env(0), 0, max_in_flight=1)
    assert t_bound.max_in_flight == 0                      # the bound took the window down
    torch.testing.assert_close(w_bound, w_sync, rtol=0, atol=0)
    assert not torch.equal(w_free, w_sync)                 # a push in flight: one step stale, so different
    assert staleness_max(t_bound) == 0
    for t in (t_sync, t_bound, t_free):
        t.close()


def _three_speeds(c, bound):
    results = run_in_threads([lambda t=t: train(c.trainer_env(t), t, sleep=(0.0, 0.01, 0.03)[t])
                              for t in range(3)], timeout=120)
    worst = staleness_max(results[0][0])
    for trainer, _ in results:
        trainer.close()
    return worst


def test_a_bound_of_k_never_records_more_than_k(cluster):
    unbounded = _three_speeds(cluster(servers=2, trainers=3, mode="async", min_block_size=1024), None)
    assert unbounded > 2, unbounded           # the fast trainer runs far ahead without a bound
    for k in (0, 2):
        got = _three_speeds(cluster(servers=2, trainers=3, mode="async", min_block_size=1024, max_staleness=k), k)
        assert 0 <= got <= k, (k, got)


def test_a_bounded_wait_for_a_dead_trainer_fails_at_once_naming_it(cluster):
    c = cluster(servers=1, trainers=2, mode="async", min_block_size=1024, max_staleness=1, timeout=30)

    def dies_after_one_step():
        model = Model()
        trainer = Trainer(model, ps.optim.SGD(lr=0.1), env=c.trainer_env(1))
        trainer.step(model.w.sum())
        trainer.close(leave=False)          # hangs up without leaving: lost, as a crash looks

    started = time.monotonic()
    try:
        run_in_threads([lambda: train(c.trainer_env(0), 0, steps=20, sleep=0.05), dies_after_one_step],
                       timeout=60)
        raise AssertionError("the chief ran 20 steps while a lost trainer stayed at 1 (bound 1)")
    except ps.ParamshardError as exc:
        assert "trainers [1]" in str(exc), exc
    assert time.monotonic() - started < 20       # well before the 30 s timeout
