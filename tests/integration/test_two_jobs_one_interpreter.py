"""No process globals (issue 31): a job's context is its env, so one interpreter runs a job
twice, or two jobs side by side, each against its own server (threads, no sockets).

Oracle: every run trains exactly as the first one does (same seed, same batches): a second
job that saw the first one's server (its rows, its step counts) would end elsewhere."""
import logging
import os
import threading

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import paramshard as ps
from paramshard import log as ps_log
from paramshard.env import ClusterEnv
from paramshard.server.assembly import build_server
from paramshard.trainer.trainer import Trainer

STEPS = 6


class Ctr(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.emb = ps.SparseEmbedding("emb", 4, optimizer=ps.optim.Adagrad(lr=0.1), init_scale=0.1)
        self.head = nn.Linear(4 * 3 + 2, 1)

    def forward(self, dense, ids):
        e = self.emb(ids.reshape(-1, 1)).view(ids.shape[0], -1)
        return self.head(torch.cat([e, dense], 1)).squeeze(1)


def batches(b=16):
    rng = np.random.default_rng(0)
    return [(torch.from_numpy(rng.standard_normal((b, 2)).astype(np.float32)),
             torch.from_numpy(rng.integers(0, 50, (b, 3))),
             torch.from_numpy((rng.random(b) < 0.4).astype(np.float32))) for _ in range(STEPS)]


def train(model, env):
    """(head weight, the table's rows, the trainer's step count) after STEPS steps."""
    with Trainer(model, ps.optim.SGD(lr=0.05), env=env) as trainer:
        assert trainer.step_count == 0         # a new job: nothing of another one's
        for dense, ids, y in batches():
            trainer.step(F.binary_cross_entropy_with_logits(model(dense, ids), y))
        ids, values = trainer.sparse.export_sparse("emb")[:2]
        order = np.argsort(ids)
        return model.head.weight.detach().clone(), ids[order], values[order], trainer.step_count


def assert_same_run(a, b):
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=0)
    np.testing.assert_array_equal(a[1], b[1])
    np.testing.assert_array_equal(a[2], b[2])
    assert a[3] == b[3] == STEPS


@pytest.fixture
def plain_script(monkeypatch):
    """A script run with no cluster: no launcher variable leaks in; the log settings ps.init()
    makes are put back afterwards."""
    for key in list(os.environ):
        if key.startswith(("PARAMSHARD_", "PADDLE_", "OMPI_")) or key == "TRAINING_ROLE":
            monkeypatch.delenv(key)
    logger = logging.getLogger("paramshard")
    saved = (list(logger.handlers), logger.propagate, logger.level, ps_log._configured)
    threads = torch.get_num_threads()
    made = []
    yield made
    for env in made:
        env.local_server.close()
    logger.handlers[:], logger.propagate, ps_log._configured = saved[0], saved[1], saved[3]
    logger.setLevel(saved[2])
    torch.set_num_threads(threads)


def test_ps_init_twice_starts_two_jobs(plain_script):
    first = ps.init()
    plain_script.append(first)
    run_1 = train(Ctr(), first)
    second = ps.init()                  # the same script's job again, in the same interpreter
    plain_script.append(second)
    assert second.local_server is not first.local_server
    run_2 = train(Ctr(), second)
    assert_same_run(run_2, run_1)


def in_process_job() -> ClusterEnv:
    """A trainer's env of a job of its own: one in-process server (``ps.init()``'s kind)."""
    server = build_server(ClusterEnv(role=None, server_id=0), num_trainers=1, watch_peers=False, in_process=True)
    return ClusterEnv(role="trainer", servers=(server.address,), local_server=server,
                      num_trainers=1, trainer_id=0, timeout=10.0)


def test_two_jobs_side_by_side_as_threads():
    """Two in-process clusters (a server each, LocalLinks) and their trainers on two threads
    at once: each job trains as a job alone does."""
    envs = [in_process_job() for _ in range(3)]
    try:
        alone = train(Ctr(), envs[0])
        models = [Ctr(), Ctr()]          # built here: torch's seed is the process's
        results, errors = [None, None], []

        def job(k):
            try:
                results[k] = train(models[k], envs[1 + k])
            except BaseException as error:      # reported below, with the job it failed in
                errors.append((k, error))

        threads = [threading.Thread(target=job, args=(k,), name=f"job {k}") for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a job's trainer did not finish within 120 s"
        assert errors == []
        assert_same_run(results[0], alone)
        assert_same_run(results[1], alone)
    finally:
        for env in envs:
            env.local_server.close()
