"""GEO mode's oracles, on servers that are threads of the test process (the `cluster` fixture).

- exact sums: what the servers hold is the initial values plus every delta the trainers sent
  (integer gradients, SGD(lr=1), two trainers: every delta is a multiple of 1/2, so each sum
  is exact in float32 whatever order the rounds arrive in);
- K=1, one trainer, blocking sends: bit for bit the run of the same model, data and optimizers
  in sync mode with one trainer (the servers applying the same rules: one process's training),
  which is also the async run that waits for each push, and the same in an elastic job (1:1);
- K>1, one trainer: that run again, up to the rounding of a round's round trip per value
  (the servers add fl(local - synced) to synced: exact whenever the subtraction is, as for
  nearby values; a few ulps otherwise), blocking or overlapped (an overlapped merge lands
  when its replies are in, a step or more later, as merged + (local now - local at send): the
  same values again up to that rounding, and which step it lands at is up to the wire);
- K=1, SGD, two trainers in step (a barrier and Trainer.pull after each step): sync SGD on the
  global batch, up to float rounding (each trainer's delta is (synced - lr g_i) - synced, halved,
  then added one after the other, where sync scales the summed gradients once).
"""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import paramshard as ps
from paramshard.client.sparse import TableSpec
from paramshard.errors import ConfigError
from paramshard.geo import trainer_state
from paramshard.geo.pacing import Pacer
from paramshard.trainer.backends.geo import GeoBackend
from paramshard.trainer.trainer import Trainer
from tests.conftest import run_in_threads
from tests.integration.geo_models import TinyCTR, batches, dense_of, split, train

STEPS, BATCH = 12, 16


def _table(trainer) -> tuple[np.ndarray, np.ndarray]:
    ids, values, _ = trainer.backend.export_table("emb")
    order = np.argsort(ids)
    return ids[order], values[order]


def _run(cluster, mode, data, dense_opt, table_opt, prefetch=False, **env):
    c = cluster(servers=2, trainers=1, mode=mode, min_block_size=16, **env)
    model, trainer = train(c.trainer_env(0), data, dense_opt, table_opt, close=False, prefetch=prefetch)
    ids, rows = _table(trainer)
    trainer.close()
    return dense_of(model), ids, rows, trainer


@pytest.mark.parametrize("dense_opt,table_opt", [
    (ps.optim.Adam(lr=0.01), ps.optim.Adagrad(lr=0.1)),
    (ps.optim.SGD(lr=0.1), ps.optim.RowWiseAdagrad(lr=0.1)),
], ids=["adam-adagrad", "sgd-rowwise"])
def test_k1_one_trainer_is_one_process_bit_for_bit(cluster, dense_opt, table_opt):
    """K=1, one trainer: the sync run, the async run that waits for each push (max_in_flight 0),
    and the same in an elastic job (--trainers 1:1: a round divides by the job's one slot)."""
    data = batches(STEPS, BATCH)
    dense, ids, rows, _ = _run(cluster, "sync", data, dense_opt, table_opt)
    runs = {"async": _run(cluster, "async", data, dense_opt, table_opt, max_in_flight=0),
            "geo": _run(cluster, "geo", data, dense_opt, table_opt, geo_k=1, geo_send="blocking"),
            "elastic geo": _run(cluster, "geo", data, dense_opt, table_opt, geo_k=1, min_trainers=1,
                                geo_send="blocking")}
    for run, (run_dense, run_ids, run_rows, trainer) in runs.items():
        if run != "async":
            assert trainer.backend.rounds == STEPS, run
        for name in dense:
            np.testing.assert_array_equal(run_dense[name], dense[name], err_msg=f"{run}: {name}")
        np.testing.assert_array_equal(run_ids, ids, err_msg=run)
        np.testing.assert_array_equal(run_rows, rows, err_msg=run)
    # and training moved them: the comparison is not between two untouched models
    assert not np.array_equal(dense["mlp.0.weight"], dense_of(TinyCTR(table_opt))["mlp.0.weight"])


@pytest.mark.parametrize("send", ["blocking", "overlapped"])
@pytest.mark.parametrize("prefetch", [False, True], ids=["pulled", "prefetched"])
def test_k_above_one_one_trainer_is_one_process(cluster, prefetch, send):
    """Prefetched rows are put into the replica at the forward, except those trained since they
    were fetched (the replica's are newer): the same run, whether rows are fetched ahead or not,
    and whether a round's merge lands before the next step or later."""
    data = batches(STEPS, BATCH)
    opts = (ps.optim.Adam(lr=0.01), ps.optim.Adagrad(lr=0.1))
    dense, ids, rows, _ = _run(cluster, "sync", data, *opts)
    geo_dense, geo_ids, geo_rows, trainer = _run(cluster, "geo", data, *opts, prefetch=prefetch, geo_k=5,
                                                 geo_send=send)
    assert trainer.backend.rounds == 3          # 5 + 5 + the 2 close() sends
    if prefetch:        # rows the replica lacked were fetched ahead, and every such fetch was taken
        stats = trainer.pipeline_stats()
        assert stats["prefetch_hits"] >= 2 and stats["prefetch_misses"] == 0, stats
    for name in dense:
        np.testing.assert_allclose(geo_dense[name], dense[name], rtol=1e-6, atol=1e-7, err_msg=name)
    np.testing.assert_array_equal(geo_ids, ids)
    np.testing.assert_allclose(geo_rows, rows, rtol=1e-6, atol=1e-7)


def test_k1_sgd_trainers_in_step_are_sync_sgd_on_the_global_batch(cluster):
    data = batches(8, 2 * BATCH)
    sgd = ps.optim.SGD(lr=0.2)
    c = cluster(servers=2, trainers=2, mode="sync", min_block_size=16)
    g = cluster(servers=2, trainers=2, mode="geo", geo_k=1, min_block_size=16)

    # Built here, one after the other: TinyCTR seeds torch's global generator, which two threads
    # building at once would interleave (the chief's initial values are the job's).
    models = {(job, tid): TinyCTR(sgd) for job in ("sync", "geo") for tid in range(2)}

    def run(env_of, tid, in_step):
        model = models["geo" if in_step else "sync", tid]
        trainer = Trainer(model, sgd, env=env_of(tid))
        if in_step:
            # Both start from the chief's values: a trainer that started late would pull them
            # with the other's first round added, and compute its first gradient elsewhere.
            trainer.barrier("start")
        for batch in data:
            ids, x, y = split(batch, 2, tid)
            trainer.step(F.binary_cross_entropy_with_logits(model(ids, x), y))
            if in_step:
                trainer.barrier("step")     # both rounds are on the servers
                trainer.pull()              # ... and every trainer reads their sum
                # ... before either sends its next round: a trainer whose pull came late (a busy
                # machine) would otherwise read the other's next round too, and compute its next
                # gradient elsewhere than sync does (off by ~1e-4, not by rounding).
                trainer.barrier("pulled")
        ids, rows = _table(trainer)
        trainer.close()
        return dense_of(model), ids, rows

    sync = run_in_threads([lambda t=t: run(c.trainer_env, t, False) for t in range(2)])
    geo = run_in_threads([lambda t=t: run(g.trainer_env, t, True) for t in range(2)])
    # Up to float rounding, and not one fixed rounding: the two halves reach a server in either
    # order, w + d0/2 + d1/2 or w + d1/2 + d0/2 (float addition is not associative), where sync
    # adds the two gradients (commutative: one result); 8 steps of a nonlinear model carry those
    # last bits on (measured over runs: 9e-8 to 4.2e-6). A wrong scale or a lost half is off by 1e-2.
    for name in sync[0][0]:
        for t in range(2):
            np.testing.assert_allclose(geo[t][0][name], sync[0][0][name], rtol=1e-5, atol=1e-5, err_msg=name)
    np.testing.assert_array_equal(geo[0][1], sync[0][1])
    np.testing.assert_allclose(geo[0][2], sync[0][2], rtol=1e-5, atol=1e-5)


class OneRowPieces(Pacer):
    """Pieces of one row (as many as half of k allows), whatever the round trips."""

    def __init__(self):
        super().__init__(rows=1)

    def answered(self, round_trip):
        pass


@pytest.mark.parametrize("send", ["blocking", "overlapped", "pieces"])
def test_servers_hold_initial_values_plus_every_delta(cluster, send):
    """Two GEO trainers (K=3, SGD lr=1, integer gradients) over shared and own rows: the servers
    end at initial - sum(all gradients) / 2 exactly, dense and sparse; every step is in a round
    (overlapped: the steps trained while a round was on the wire go out with the next one;
    pieces: K=8, each round in K/2 pushes, one a step, geo/flight.py)."""
    trainers, steps, k, dim = 2, 20, 8 if send == "pieces" else 3, 4
    c = cluster(servers=2, trainers=trainers, mode="geo", geo_k=k, min_block_size=64,
                geo_send="overlapped" if send == "pieces" else send)
    rng = np.random.default_rng(7)
    w0 = rng.integers(-50, 50, 300).astype(np.float32)
    shared = np.arange(1, 17, dtype=np.uint64)
    own = [np.arange(100 + 100 * t, 108 + 100 * t, dtype=np.uint64) for t in range(trainers)]
    spec = TableSpec("emb", dim, ps.optim.SGD(lr=1.0), init_scale=0.0)
    plan_inputs = [("w", torch.nn.Parameter(torch.from_numpy(w0.copy())))]
    sums_w = np.zeros((trainers, 300), np.int64)
    sums_rows: list[dict[int, np.ndarray]] = [{} for _ in range(trainers)]
    registered, done = threading.Event(), threading.Barrier(trainers, timeout=60)
    backends, rounds = [None] * trainers, [[] for _ in range(trainers)]

    def trainer(t: int):
        env = c.trainer_env(t)
        values = {"w": w0.copy() if t == 0 else np.zeros(300, np.float32)}
        backend = GeoBackend.connect(env, params=plan_inputs)
        if send == "pieces":
            backend._pacer = OneRowPieces()
        backend.on_round = lambda r, next_k, step: rounds[t].append((r.steps, next_k, step, r.pieces))
        backends[t] = backend
        if t != 0:
            registered.wait(30)
        backend.start(values, ps.optim.SGD(lr=1.0), {"emb": spec}, None, is_chief=t == 0)
        registered.set()
        g = np.random.default_rng(100 + t)
        for step in range(steps):
            ids = np.unique(np.concatenate([g.choice(shared, 5, replace=False), g.choice(own[t], 2)]))
            backend.rows("emb", ids, dim, step, True)
            grad_w = g.integers(-3, 4, 300).astype(np.float32)
            grad_rows = g.integers(-3, 4, (len(ids), dim)).astype(np.float32)
            sums_w[t] += grad_w.astype(np.int64)
            for i, r in zip(ids.tolist(), grad_rows.astype(np.int64)):
                sums_rows[t][i] = sums_rows[t].get(i, 0) + r
            backend.push({"w": grad_w}, [("emb", ids, grad_rows)], step, values)
        backend.flush()
        done.wait()          # both trainers' last rounds are on the servers
        return values

    run_in_threads([lambda t=t: trainer(t) for t in range(trainers)], timeout=120)
    try:
        held = {}
        backends[0].servers.dense.pull_dense(held := {"w": np.empty(300, np.float32)}, 0)
        ids, rows, _ = backends[0].export_table("emb")
        expected_w = w0.astype(np.int64) * 2 - sums_w.sum(axis=0)          # x2: exact halves
        np.testing.assert_array_equal(held["w"] * 2, expected_w.astype(np.float32))
        expected_rows = {}
        for part in sums_rows:
            for i, s in part.items():
                expected_rows[i] = expected_rows.get(i, 0) - s
        assert sorted(ids.tolist()) == sorted(expected_rows)
        for i, row in zip(ids.tolist(), rows):
            np.testing.assert_array_equal(row * 2, expected_rows[i].astype(np.float32), err_msg=f"row {i}")
        for t in range(trainers):
            assert sum(s for s, _, _, _ in rounds[t]) == steps          # every local step was sent once
            assert all(s <= k and next_k == k for s, next_k, _, _ in rounds[t])
            assert rounds[t][-1][2] == steps
            if send == "pieces":         # the rounds of 8 steps (12-20 rows) went in 2-4 pieces, not 1
                assert all(2 <= p <= k // 2 for s, _, _, p in rounds[t] if s == k), rounds[t]
    finally:
        for b in backends:
            if b is not None:
                b.leave(10)
                b.hang_up()


def _table_of(backend):
    ids, values, _ = backend.export_table("emb")
    order = np.argsort(ids)
    return ids[order], values[order]


@pytest.mark.parametrize("send", ["blocking", "overlapped"])
def test_a_resumed_run_trains_as_an_uninterrupted_one(cluster, tmp_path, send):
    """K=4, checkpoints every 6 steps: 12 steps in one go, or 6, a new job resumed from the
    checkpoint, and 6 more, end alike (Adam and Adagrad: each trainer's optimizer state is in
    the checkpoint; the save sent the round in progress and took its merge). Blocking: bit for
    bit. Overlapped: up to the rounding of merges that land at other steps (the wire decides)."""
    data = batches(STEPS, BATCH)
    opts = (ps.optim.Adam(lr=0.01), ps.optim.Adagrad(lr=0.1))

    def run(root, parts):
        for part, resume in parts:
            c = cluster(servers=2, trainers=1, mode="geo", geo_k=4, min_block_size=16, checkpoint_dir=str(root),
                        checkpoint_every=6, geo_send=send)
            model = TinyCTR(opts[1])
            trainer = Trainer(model, opts[0], env=c.trainer_env(0), resume=root if resume else None)
            assert trainer.step_count == (6 if resume else 0)
            for ids, x, y in data[trainer.step_count:part]:
                trainer.step(F.binary_cross_entropy_with_logits(model(ids, x), y))
            ids, rows = _table_of(trainer.backend)
            trainer.close()
            c.close()
        return dense_of(model), ids, rows

    whole = run(tmp_path / "a", [(STEPS, False)])
    resumed = run(tmp_path / "b", [(6, False), (STEPS, True)])
    assert (tmp_path / "b" / trainer_state.relpath(6, 0)).is_file()
    np.testing.assert_array_equal(resumed[1], whole[1])
    if send == "blocking":
        for name in whole[0]:
            np.testing.assert_array_equal(resumed[0][name], whole[0][name], err_msg=name)
        np.testing.assert_array_equal(resumed[2], whole[2])
    else:
        for name in whole[0]:
            np.testing.assert_allclose(resumed[0][name], whole[0][name], rtol=1e-6, atol=1e-7, err_msg=name)
        np.testing.assert_allclose(resumed[2], whole[2], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("wrote,resumes", [("geo", "sync"), ("sync", "geo")])
def test_a_checkpoint_resumes_in_its_own_kind_of_mode_only(cluster, tmp_path, wrote, resumes):
    """A geo checkpoint's servers hold SGD(lr=1.0) sums and each trainer its own optimizer state;
    another mode's hold the model's optimizer state: each is refused in the other, by name."""
    opts = (ps.optim.Adam(lr=0.01), ps.optim.Adagrad(lr=0.1))
    c = cluster(servers=1, trainers=1, mode=wrote, checkpoint_dir=str(tmp_path))
    _, trainer = train(c.trainer_env(0), batches(2, BATCH), *opts)       # close() saves the final checkpoint
    r = cluster(servers=1, trainers=1, mode=resumes)
    with pytest.raises(ConfigError, match=f"written in {wrote} mode"):
        Trainer(TinyCTR(opts[1]), opts[0], env=r.trainer_env(0), resume=tmp_path)
