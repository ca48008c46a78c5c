"""GEO mode's rollback (``--max-restarts``): a server restarted in place loses what it held; the
trainer's next send fails, every server goes back to the latest checkpoint, the trainer's replica
and optimizer state go back to what it saved there (geo/trainer_state.py), and training goes on
from the checkpoint's step: it ends bit for bit as a run without the restart (one trainer).

In-process (no process start): the trainer's links are pointed at a second server built as the
launcher restarts one (``recovering``), as a kill -9 and a restart in place would leave them
(as tests/integration/test_restart_at_close.py does)."""
from __future__ import annotations

import numpy as np
import torch.nn.functional as F

import paramshard as ps
from paramshard.env import ClusterEnv
from paramshard.server.assembly import build_server
from paramshard.trainer.trainer import Trainer
from tests.integration.geo_models import TinyCTR, batches, dense_of

STEPS = 14


def _server(recovering: bool = False):
    return build_server(ClusterEnv(role=None, server_id=0, mode="geo", recovering=recovering), num_trainers=1,
                        watch_peers=False, in_process=True)


def _run(tmp_path, restart_at: int | None):
    server = _server()
    env = ClusterEnv(role="trainer", servers=(server.address,), local_server=server, num_trainers=1, trainer_id=0,
                     timeout=10.0, mode="geo", geo_k=4, checkpoint_dir=str(tmp_path), checkpoint_every=6,
                     max_restarts=1)
    data = batches(STEPS, 16)
    model = TinyCTR(ps.optim.Adagrad(lr=0.1))
    trainer = Trainer(model, ps.optim.Adam(lr=0.01), env=env)
    restarted = None
    while trainer.step_count < STEPS:
        if trainer.step_count == restart_at and restarted is None:
            restarted = _server(recovering=True)     # empty: holds nothing of the job until the rollback
            trainer.backend.links.server = restarted
        ids, x, y = data[trainer.step_count]
        trainer.step(F.binary_cross_entropy_with_logits(model(ids, x), y))
    ids, rows, _ = trainer.backend.export_table("emb")
    trainer.close()
    order = np.argsort(ids)
    return dense_of(model), ids[order], rows[order], trainer.recoveries


def test_a_rollback_trains_on_as_a_run_without_the_restart(tmp_path):
    whole = _run(tmp_path / "a", None)
    # Restarted after step 9: steps 7-9 are in the replica's unsent round; the send at step 10
    # fails, and steps 7-10 are trained again from checkpoint 6.
    rolled = _run(tmp_path / "b", 9)
    assert (whole[3], rolled[3]) == (0, 1)
    for name in whole[0]:
        np.testing.assert_array_equal(rolled[0][name], whole[0][name], err_msg=name)
    np.testing.assert_array_equal(rolled[1], whole[1])
    np.testing.assert_array_equal(rolled[2], whole[2])
