"""Overlapping communication with compute (client/step.py, trainer/prefetch.py).

Oracles: with gradients that do not depend on the parameters, what the servers
hold after any interleaving of in-flight pushes is exactly the initial value
minus lr times everything pushed; a forward never sees dense values older than
``max_in_flight`` of its own steps; prefetched rows are the rows a pull would
give (sync results are unchanged: see test_sparse_training's sync oracle,
which runs with and without prefetching).
"""
import logging
import threading

import numpy as np
import pytest
import torch
import torch.nn as nn

import paramshard as ps
from paramshard.errors import ConfigError
from paramshard.placement.sparse_hash import initial_rows
from paramshard.trainer.trainer import Trainer
from tests.conftest import run_in_threads

DIM, SEED, SCALE, LR = 4, 3, 0.1, 0.01


class LinearInGrads(nn.Module):
    """loss = sum(w * x) + sum(rows): gradients x and one per id occurrence, whatever the values."""

    def __init__(self, features=8):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(features))
        self.emb = ps.SparseEmbedding("t", DIM, optimizer=ps.optim.SGD(lr=LR), seed=SEED, init_scale=SCALE)
        self.seen_w: list[np.ndarray] = []

    def forward(self, x, ids):
        self.seen_w.append(self.w.detach().numpy().copy())
        return (self.w * x).sum() + self.emb(ids).sum()


def make_batches(n, seed, features=8, bag=5, vocab=40):
    rng = np.random.default_rng(seed)
    return [(torch.from_numpy(rng.standard_normal(features).astype(np.float32)),
             torch.from_numpy(rng.integers(0, vocab, (3, bag)).astype(np.int64))) for _ in range(n)]


@pytest.mark.parametrize("fresh_rows", [True, False])
@pytest.mark.parametrize("window", [0, 1, 3])
def test_async_pushes_in_flight_lose_nothing(cluster, window, fresh_rows):
    """2 trainers, pushes in flight and prefetched rows: the servers end with exactly
    initial - lr * (every gradient pushed), dense and sparse."""
    c = cluster(servers=2, trainers=2, mode="async")
    data = [make_batches(30, seed=t) for t in range(2)]
    models = [LinearInGrads() for _ in range(2)]
    both_pushed = threading.Barrier(2, timeout=30)
    held = {}

    def train(t):
        trainer = Trainer(models[t], ps.optim.SGD(lr=LR), env=c.trainer_env(t), max_in_flight=window)
        for x, ids in trainer.prefetching(data[t], fresh_rows=fresh_rows):
            trainer.step(models[t](x, ids))
        trainer.pull()               # waits for this trainer's pushes in flight
        both_pushed.wait()
        if t == 0:                   # read the servers before the last trainer leaves and they stop
            trainer.pull()
            held["w"] = models[0].w.detach().numpy().copy()
            held["ids"], held["rows"] = trainer.sparse.export_sparse("t")
        both_pushed.wait()
        stats = trainer.pipeline_stats()
        trainer.close()
        return stats

    stats = run_in_threads([lambda t=t: train(t) for t in range(2)])
    all_x = sum(x for batches in data for x, _ in batches).numpy()
    counts = np.bincount(np.concatenate([ids.numpy().ravel() for b in data for _, ids in b]), minlength=40)
    ids = np.flatnonzero(counts).astype(np.uint64)
    np.testing.assert_array_equal(held["ids"], ids)
    expected_rows = initial_rows(SEED, ids, DIM, SCALE) - LR * counts[counts > 0][:, None]
    np.testing.assert_allclose(held["rows"], expected_rows, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(held["w"], -LR * all_x, rtol=1e-4, atol=1e-6)
    for s in stats:
        assert s["steps"] == 30
        assert s["max_in_flight_seen"] <= window
        # Every batch but the first two is prefetched (the inputs are learnt on the first).
        assert (s["prefetch_hits"], s["prefetch_misses"]) == (28, 0)


@pytest.mark.parametrize("window", [0, 2])
def test_a_forward_sees_dense_values_at_most_window_steps_old(cluster, window):
    """One async trainer: the w a forward sees has every update but at most ``window``
    of its own latest ones (w_seen(k) = -lr * sum(x_j, j < k - m), 0 <= m <= window)."""
    c = cluster(servers=1, trainers=1, mode="async")
    batches = make_batches(25, seed=5)
    model = LinearInGrads()
    with Trainer(model, ps.optim.SGD(lr=LR), env=c.trainer_env(0), max_in_flight=window) as trainer:
        for x, ids in trainer.prefetching(batches):
            trainer.step(model(x, ids))
    xs = np.stack([x.numpy() for x, _ in batches])
    lags = []
    for k, seen in enumerate(model.seen_w):
        candidates = [m for m in range(k + 1) if np.allclose(seen, -LR * xs[:k - m].sum(0), atol=1e-6)]
        assert candidates, f"step {k}: w matches no prefix of the pushed gradients"
        lags.append(candidates[0])
    assert max(lags) <= window
    if window == 0:
        assert lags == [0] * len(lags)


def test_sync_mode_refuses_pushes_in_flight(cluster):
    c = cluster(servers=1, trainers=1, mode="sync")
    with pytest.raises(ConfigError, match="sync mode waits for every step"):
        Trainer(LinearInGrads(), ps.optim.SGD(lr=LR), env=c.trainer_env(0), max_in_flight=1)


def test_prefetched_rows_equal_pulled_rows_and_computed_ids_need_ids_argument(cluster, caplog):
    """A model that offsets its ids inside forward: prefetching cannot find them and says
    so (rows are pulled in the forward); with ``ids=`` it prefetches. Same rows either way."""
    class Offset(LinearInGrads):
        def forward(self, x, ids):
            return super().forward(x, ids + 1000)

    results = {}
    for how in ("auto", "ids"):
        c = cluster(servers=2, trainers=1, mode="sync")
        model = Offset()
        batches = make_batches(12, seed=9)
        ids_fn = (lambda batch: batch[1] + 1000) if how == "ids" else None
        with caplog.at_level(logging.INFO, logger="paramshard.trainer"):
            with Trainer(model, ps.optim.SGD(lr=LR), env=c.trainer_env(0)) as trainer:
                for x, ids in trainer.prefetching(batches, ids=ids_fn):
                    trainer.step(model(x, ids))
                results[how] = (trainer.pipeline_stats(), trainer.sparse.export_sparse("t"))
    auto, given = results["auto"][0], results["ids"][0]
    assert (auto["prefetch_hits"], auto["prefetch_misses"]) == (0, 0)
    assert (given["prefetch_hits"], given["prefetch_misses"]) == (11, 0)
    assert any("cannot tell which part of the batch table 't'" in r.getMessage() for r in caplog.records)
    np.testing.assert_array_equal(results["auto"][1][0], results["ids"][1][0])
    np.testing.assert_array_equal(results["auto"][1][1], results["ids"][1][1])


def test_breaking_out_of_the_loop_leaves_nothing_in_flight(cluster):
    c = cluster(servers=1, trainers=1, mode="async")
    model = LinearInGrads()
    with Trainer(model, ps.optim.SGD(lr=LR), env=c.trainer_env(0), max_in_flight=2) as trainer:
        for k, (x, ids) in enumerate(trainer.prefetching(make_batches(10, seed=1))):
            if k == 5:
                break
            trainer.step(model(x, ids))
        assert trainer.steps.fetches_in_flight == 0    # the generator closed: its prefetch is dropped
        trainer.pull()
        assert trainer.steps.in_flight == 0


def test_a_wrong_ids_guess_stops_prefetching_with_a_warning(cluster, caplog):
    c = cluster(servers=1, trainers=1, mode="async")
    model = LinearInGrads()
    with caplog.at_level(logging.WARNING, logger="paramshard.trainer"):
        with Trainer(model, ps.optim.SGD(lr=LR), env=c.trainer_env(0)) as trainer:
            for x, ids in trainer.prefetching(make_batches(10, seed=2), ids=lambda batch: batch[1] + 1):
                trainer.step(model(x, ids))
            stats = trainer.pipeline_stats()
    assert stats["prefetch_hits"] == 0 and stats["pulls"] == 10
    assert any("went unused 3 batches in a row" in r.getMessage() for r in caplog.records)


def test_empty_batches_fetch_nothing_and_do_not_stop_prefetching(cluster, caplog):
    """Sync DynamicShards steps a trainer without a task on empty batches, with no forward: they
    are neither prefetched (nothing to fetch) nor counted as unused, and a loop that starts on
    them still learns where the ids are from its first real batch (before, three empty batches
    in a row turned prefetching off for the rest of the epoch, with a warning)."""
    c = cluster(servers=1, trainers=1, mode="sync")
    model = LinearInGrads()
    real = make_batches(8, seed=5)
    empty = (torch.zeros(8), torch.zeros((0, 5), dtype=torch.int64))
    batches = [empty, empty] + real[:4] + [empty] * 4 + real[4:]
    with caplog.at_level(logging.INFO, logger="paramshard.trainer"):
        with Trainer(model, ps.optim.SGD(lr=LR), env=c.trainer_env(0)) as trainer:
            for x, ids in trainer.prefetching(batches):
                trainer.step(model(x, ids) if len(ids) else None)
            stats = trainer.pipeline_stats()
    assert not [r for r in caplog.records if "went unused" in r.getMessage() or "cannot tell" in r.getMessage()]
    # The first two real batches are pulled (where the ids are is learnt from the first's forward),
    # as at the start of any loop; every other real batch was fetched ahead.
    assert (stats["prefetch_hits"], stats["prefetch_misses"], stats["pulls"]) == (6, 0, 2), stats


def test_servers_report_where_their_time_goes(cluster):
    """Per-phase seconds for the benchmark's profile; rows_updated counts every pushed row."""
    c = cluster(servers=1, trainers=1, mode="async")
    model = LinearInGrads()
    batches = make_batches(6, seed=4)
    with Trainer(model, ps.optim.SGD(lr=LR), env=c.trainer_env(0)) as trainer:
        for x, ids in trainer.prefetching(batches):
            trainer.step(model(x, ids))
        trainer.pull()
        (stats,) = trainer.server_stats()
    phases = stats["phase_seconds"]
    for phase in ("decode", "push_sparse", "pull_sparse", "push_dense", "reply"):
        assert phases[phase] > 0, phase
    table = stats["tables"]["t"]
    assert table["rows_updated"] == sum(len(np.unique(ids.numpy())) for _, ids in batches)
    for phase in ("pull_lookup", "pull_gather", "push_lookup", "push_optimizer"):
        assert table["phase_seconds"][phase] > 0, phase


@pytest.mark.parametrize("window", [1, 2])
def test_async_prefetched_rows_are_never_staler_than_a_serial_run(cluster, window):
    """The rows a forward sees hold every earlier step's update of this trainer, pushes in
    flight or not: rows of ids the step before pushes are asked for right after that push."""
    c = cluster(servers=2, trainers=1, mode="async")
    batches = make_batches(20, seed=8, vocab=12)        # few ids: most recur in the next batch
    model = LinearInGrads()
    seen = []
    with Trainer(model, ps.optim.SGD(lr=LR), env=c.trainer_env(0), max_in_flight=window) as trainer:
        rows_of = trainer.steps.rows

        def recording(table, ids, *args, **kwargs):       # what each forward got, prefetched or not
            rows = rows_of(table, ids, *args, **kwargs)
            seen.append((ids.copy(), rows.copy()))
            return rows
        trainer.steps.rows = recording
        for x, ids in trainer.prefetching(batches):
            trainer.step(model(x, ids))
        stats = trainer.pipeline_stats()
    assert stats["prefetch_hits"] >= len(batches) - 2
    assert len(seen) == len(batches)
    counts = np.zeros(12)
    for (x, ids), (got_ids, got_rows) in zip(batches, seen):
        expected = initial_rows(SEED, got_ids, DIM, SCALE) - LR * counts[got_ids.astype(np.int64)][:, None]
        np.testing.assert_allclose(got_rows, expected, rtol=1e-5, atol=1e-6)
        counts += np.bincount(ids.numpy().ravel(), minlength=12)
