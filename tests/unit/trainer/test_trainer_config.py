"""What a Trainer refuses, refused before it joins or connects anything (no servers, milliseconds).

Every refusal here runs with the network and the trainers' group forbidden: a
refused configuration must leave nothing behind (issue 21: in collective mode a
model with a SparseEmbedding used to be refused after the gloo group was joined)."""
import numpy as np
import pytest
import torch

import paramshard as ps
from paramshard import runtime
from paramshard.collective import group
from paramshard.collective.allreduce_sync import AllreduceDenseSync
from paramshard.env import ClusterEnv
from paramshard.errors import ConfigError
from paramshard.mode import Mode
from paramshard.server.core.barrier import Membership
from paramshard.server.storage.dense_store import DenseStore
from paramshard.trainer import trainer_config
from paramshard.trainer.trainer import Trainer


@pytest.fixture
def nothing_joined(monkeypatch):
    """Reaching a server or joining the trainers' group fails the test."""
    def forbidden(*args, **kwargs):
        raise AssertionError("the Trainer joined or connected before refusing its configuration")
    monkeypatch.setattr(runtime, "links_for", forbidden)
    monkeypatch.setattr(group, "join", forbidden)


def trainer_env(mode, **kwargs):
    servers = () if mode is Mode.COLLECTIVE else ("127.0.0.1:1",)
    return ClusterEnv(role="trainer", mode=mode, servers=servers, **kwargs)


class WithTable(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = ps.SparseEmbedding("feat", 4)
        self.out = torch.nn.Linear(4, 1)


def test_collective_mode_refuses_a_sparse_table_before_joining_the_group(nothing_joined):
    with pytest.raises(ConfigError, match=r"SparseEmbedding tables \['feat'\], and collective mode has no servers"):
        Trainer(WithTable(), env=trainer_env(Mode.COLLECTIVE))


@pytest.mark.parametrize("mode", [Mode.COLLECTIVE, Mode.HYBRID])
@pytest.mark.parametrize("setting", [dict(checkpoint_dir="/tmp/ckpt"), dict(resume="/tmp/ckpt/step-3")])
def test_allreduce_modes_refuse_checkpoints_before_joining(nothing_joined, mode, setting):
    with pytest.raises(ConfigError, match=f"checkpoints are not available in {mode} mode yet"):
        Trainer(torch.nn.Linear(3, 1), env=trainer_env(mode, **setting))


def test_resume_argument_counts_like_the_environment(nothing_joined):
    with pytest.raises(ConfigError, match="drop --checkpoint-dir/--resume"):
        Trainer(torch.nn.Linear(3, 1), env=trainer_env(Mode.HYBRID), resume="/somewhere/step-2")


@pytest.mark.parametrize("mode", [Mode.SYNC, Mode.COLLECTIVE, Mode.HYBRID])
def test_only_async_leaves_pushes_in_flight(nothing_joined, mode):
    with pytest.raises(ConfigError, match=f"max_in_flight=2: {mode} mode waits for every step"):
        Trainer(torch.nn.Linear(3, 1), env=trainer_env(mode), max_in_flight=2)


def test_the_window_is_a_whole_number_and_staleness_bounds_it():
    env = trainer_env(Mode.ASYNC)
    assert trainer_config.in_flight_window(env, None) == 1          # the default
    assert trainer_config.in_flight_window(env, 0) == 0
    assert trainer_config.in_flight_window(trainer_env(Mode.ASYNC, max_in_flight=3), None) == 3
    assert trainer_config.in_flight_window(trainer_env(Mode.ASYNC, max_staleness=2), 5) == 2
    assert trainer_config.in_flight_window(trainer_env(Mode.SYNC), None) == 0
    for bad in (-1, 1.5, "2"):
        with pytest.raises(ConfigError, match="max_in_flight must be a whole number >= 0"):
            trainer_config.in_flight_window(env, bad)


def test_a_server_rank_cannot_train(nothing_joined):
    env = ClusterEnv(role="server", servers=("127.0.0.1:1",), server_id=0)
    with pytest.raises(ConfigError, match="Trainer needs a trainer process, this one is server 0"):
        Trainer(torch.nn.Linear(3, 1), env=env)


def test_parameters_must_be_contiguous_float32_on_cpu(nothing_joined):
    with pytest.raises(ConfigError, match="parameter weight: paramshard serves contiguous float32 CPU"):
        Trainer(torch.nn.Linear(3, 1).double(), env=trainer_env(Mode.SYNC))


def test_validate_finds_the_dense_parameters_and_the_tables():
    model = WithTable()
    model.out.bias.requires_grad_(False)        # frozen: not trained
    config = trainer_config.validate(trainer_env(Mode.HYBRID), model)
    assert [name for name, _ in config.params] == ["out.weight"]
    assert list(config.tables) == ["feat"] and config.max_in_flight == 0 and config.resume_from is None


@pytest.mark.parametrize("mode", [Mode.COLLECTIVE, Mode.HYBRID])
def test_save_is_refused_without_checkpoints_in_the_mode(mode):
    with pytest.raises(ConfigError, match=f"Trainer.save\\(\\): checkpoints are not available in {mode} mode yet"):
        trainer_config.check_save(trainer_env(mode), "/tmp/ckpt")


def test_save_needs_a_directory_in_the_modes_that_have_checkpoints():
    for mode in (Mode.SYNC, Mode.ASYNC):
        trainer_config.check_save(trainer_env(mode), "/tmp/ckpt")        # allowed
        with pytest.raises(ConfigError, match="Trainer.save\\(\\) needs a directory"):
            trainer_config.check_save(trainer_env(mode), None)


@pytest.mark.parametrize("mode", [Mode.SYNC, Mode.ASYNC, Mode.COLLECTIVE, Mode.HYBRID])
@pytest.mark.parametrize("optimizer", [ps.optim.RowWiseAdagrad(lr=0.1), ps.optim.RowWiseAdagrad],
                         ids=["instance", "class"])
def test_the_dense_optimizer_cannot_be_row_wise(nothing_joined, mode, optimizer):
    with pytest.raises(ConfigError, match=r"Trainer\(optimizer=ps\.optim\.RowWiseAdagrad.*: RowWiseAdagrad is for "
                                          r"SparseEmbedding tables; dense parameters: use Adagrad"):
        Trainer(torch.nn.Linear(3, 1), optimizer, env=trainer_env(mode))


def test_a_table_takes_row_wise_adagrad(nothing_joined):
    class RowWiseTable(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = ps.SparseEmbedding("feat", 4, optimizer=ps.optim.RowWiseAdagrad(lr=0.1))
            self.out = torch.nn.Linear(4, 1)
    with pytest.raises(AssertionError, match="joined or connected"):     # accepted: gets as far as the servers
        Trainer(RowWiseTable(), ps.optim.Adagrad(lr=0.1), env=trainer_env(Mode.SYNC))


def test_neither_the_dense_store_nor_allreduce_take_a_row_wise_optimizer():
    """Behind the Trainer's refusal: a server (a hand-made request) and collective mode refuse too."""
    store = DenseStore(Mode.SYNC, Membership(1, grace=5.0))
    with pytest.raises(ConfigError, match="register_dense: RowWiseAdagrad is for SparseEmbedding tables"):
        store.register(0, ["w"], [np.zeros(4, np.float32)], ps.optim.RowWiseAdagrad(), 1)
    assert not store.registered
    with pytest.raises(ConfigError, match="RowWiseAdagrad is for SparseEmbedding tables"):
        AllreduceDenseSync(ps.optim.RowWiseAdagrad(), {"w": np.zeros(4, np.float32)})
