"""trainer/backends/row_source.py: the backend makes the object a SparseEmbedding's forward reads
its rows from; it reads at the trainer's current step (its TrainerProgress), and a failure the
recovery policy admits rolls the trainer back and voids the step, as the Trainer's own pull did."""
import numpy as np
import pytest
import torch

from paramshard.client.recovery import RecoveryPolicy
from paramshard.client.step import PipelineStats
from paramshard.env import ClusterEnv
from paramshard.errors import ConfigError, ServerUnavailable
from paramshard.mode import Mode
from paramshard.trainer.backends.collective import CollectiveBackend
from paramshard.trainer.backends.row_source import RowSource
from paramshard.trainer.backends.servers import ServerBackend
from paramshard.trainer.progress import TrainerProgress
from paramshard.trainer.sparse_embedding import SparseEmbedding


class RowSteps:
    """A StepClient that answers a pull with rows saying the version they were read at (every
    value is it), and fails the next ``failures`` pulls as a dead server does."""

    def __init__(self, failures=0):
        self.stats, self.failures, self.pulls = PipelineStats(), failures, []

    def rows(self, table, ids, dim, min_version, create=True):
        self.pulls.append((table, ids.tolist(), min_version, create))
        if self.failures:
            self.failures -= 1
            raise ServerUnavailable("server 0 is gone")
        return np.full((len(ids), dim), float(min_version), np.float32)


def backend(steps, mode=Mode.SYNC):
    env = ClusterEnv(role="trainer", mode=mode, servers=("127.0.0.1:1",))
    return ServerBackend(env, links=None, plan=None, dense=None, sparse=None, steps=steps)


def progress(max_restarts=0):
    return TrainerProgress(0, RecoveryPolicy(max_restarts, "/ckpt" if max_restarts else None))


def test_the_forward_reads_through_the_backends_row_source_at_the_trainers_step():
    steps, p = RowSteps(), progress()
    table = SparseEmbedding("emb", 2)
    source = backend(steps).row_source("emb", 2, p)
    assert isinstance(source, RowSource)
    table.attach(source)
    ids = torch.tensor([[3], [5], [3]])
    assert table(ids).tolist() == [[0.0, 0.0]] * 3
    p.advance()
    p.advance()
    out = table(ids)            # sync: a pull at step 2 waits for version 2
    assert out.tolist() == [[2.0, 2.0]] * 3
    table.eval()
    table(ids)
    assert steps.pulls == [("emb", [3, 5], 0, True), ("emb", [3, 5], 2, True), ("emb", [3, 5], 2, False)]
    table.train()
    out.sum().backward()        # the rows a training forward read are trainable: their gradients are kept
    ids_pushed, grads = table.take_gradients()
    assert ids_pushed.tolist() == [3, 5] and grads.tolist() == [[2.0, 2.0], [1.0, 1.0]]


def test_a_failed_pull_the_policy_admits_rolls_back_reads_again_at_the_restored_step_and_voids_the_step():
    steps, p = RowSteps(failures=1), progress(max_restarts=1)
    p.step = 9
    p.restore_with(lambda: (None, 4))      # the servers went back to the checkpoint of step 4
    rows = backend(steps).row_source("emb", 3, p)(np.array([7], np.uint64), True)
    assert rows.tolist() == [[4.0, 4.0, 4.0]]
    assert [pull[2] for pull in steps.pulls] == [9, 4]
    assert p.recoveries == 1 and p.take_void_step()


def test_a_failed_pull_without_recovery_is_the_error():
    steps, p = RowSteps(failures=1), progress(max_restarts=0)
    p.restore_with(lambda: pytest.fail("restored with recovery off"))
    with pytest.raises(ServerUnavailable):
        backend(steps).row_source("emb", 3, p)(np.array([7], np.uint64), True)
    assert not p.take_void_step()


def test_a_mode_without_servers_makes_no_row_source():
    collective = CollectiveBackend.__new__(CollectiveBackend)
    collective.mode = Mode.COLLECTIVE
    with pytest.raises(ConfigError, match="no parameter servers"):
        collective.row_source("emb", 2, progress())

