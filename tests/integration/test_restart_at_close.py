"""A server restarted in place after the trainers' final checkpoint, before their leave (issue 33's
kill matrix, `server@end`): the restarted server holds nothing yet (epoch -1), so it must not take
the leave and end the job as if it held the trained model (its deltas, its final state would stop
short of the final checkpoint). It refuses the leave; the chief rolls back to the final checkpoint,
which holds every step, and leaves again: the restarted server ends holding the final model.

In-process (no process start): the trainer's links are pointed at a second server built as the
launcher restarts one (``recovering``), as a kill -9 and a restart in place would leave them."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import paramshard as ps
from paramshard.env import ClusterEnv
from paramshard.errors import RemoteError
from paramshard.server.assembly import build_server
from paramshard.trainer.trainer import Trainer


def _server(recovering: bool = False):
    return build_server(ClusterEnv(role=None, server_id=0, recovering=recovering), num_trainers=1,
                        watch_peers=False, in_process=True)


def _trained(tmp_path, mode: str, max_restarts: int):
    server = _server()
    env = ClusterEnv(role="trainer", servers=(server.address,), local_server=server, num_trainers=1, trainer_id=0,
                     timeout=10.0, mode=mode, checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=10 ** 6,
                     max_restarts=max_restarts)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    trainer = Trainer(model, ps.optim.Adam(lr=0.01), env=env)
    x, y = torch.randn(64, 32), torch.randn(64, 1)
    for _ in range(6):
        trainer.step(torch.nn.functional.mse_loss(model(x), y))
    trainer.save()          # the final checkpoint (close() saves none after it: nothing is unsaved)
    return server, model, trainer


def _held(server) -> np.ndarray:
    blocks = server.dense.blocks
    return np.concatenate([blocks[name].values for name in sorted(blocks)]) if blocks else np.zeros(0)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_restarted_server_gets_the_final_checkpoint_before_it_takes_the_leave(tmp_path, mode):
    first, model, trainer = _trained(tmp_path, mode, max_restarts=1)
    trained = _held(first)
    restarted = _server(recovering=True)            # server 0 killed -9 and restarted in place: empty
    trainer.backend.links.server = restarted
    trainer.close()
    assert restarted.membership.left == {0}
    assert restarted.context.epoch >= 1                 # the chief reset it and restored the checkpoint
    np.testing.assert_array_equal(_held(restarted), trained)
    assert trainer.step_count == 6
    ours = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
    assert sorted(ours.tolist()) == sorted(trained.tolist())


def test_without_recovery_the_leave_fails_and_says_the_server_lost_its_state(tmp_path):
    first, _, trainer = _trained(tmp_path, "async", max_restarts=0)
    restarted = _server(recovering=True)
    trainer.backend.links.server = restarted
    with pytest.raises(RemoteError, match="restarted"):
        trainer.close()
    assert restarted.membership.left == set()            # it did not end as if it held the model
