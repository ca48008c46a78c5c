"""Checkpoints through real servers: a resumed sync run ends bit-identical to an
uninterrupted one, on the same or another number of servers and dispatch."""
import json

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import paramshard as ps
from paramshard.checkpoint.format import Checkpoint, CheckpointError
from paramshard.trainer.trainer import Trainer
from tests.conftest import run_in_threads

from tests.e2e.scripts.resumable import DIM, Model, batch   # the model and batches the e2e resume tests use

STEPS, CUT = 10, 6


def run(cluster, servers, dispatch, stop_at, ckpt_dir=None, resume=None, save_at=None):
    c = cluster(servers=servers, trainers=2, mode="sync", dispatch=dispatch, min_block_size=100)
    models = [Model() for _ in range(2)]

    def trainer_fn(tid):
        trainer = Trainer(models[tid], ps.optim.Adam(lr=0.01), env=c.trainer_env(tid), resume=resume)
        trainer.first_step = trainer.step_count
        while trainer.step_count < stop_at:
            k = trainer.step_count
            ids, y = batch(k, tid)
            trainer.step(F.binary_cross_entropy_with_logits(models[tid](ids), y))
            if save_at is not None and trainer.step_count == save_at:
                trainer.save(ckpt_dir, state={"next_batch": trainer.step_count})
        return trainer

    trainers = run_in_threads([lambda t=t: trainer_fn(t) for t in range(2)])
    dense = {n: p.detach().numpy().copy() for n, p in models[0].named_parameters() if p.requires_grad}
    ids, rows = trainers[0].sparse.export_sparse("feat")
    for t in trainers:
        t.close()
    assert {t.first_step for t in trainers} == {CUT if resume else 0}
    return dense, ids, rows


@pytest.mark.parametrize("servers,dispatch", [(2, "round_robin"), (3, "balanced"), (1, "hash")])
def test_sync_resume_equals_uninterrupted(cluster, tmp_path, servers, dispatch):
    whole = run(cluster, 2, "round_robin", STEPS)
    run(cluster, 2, "round_robin", CUT, ckpt_dir=tmp_path, save_at=CUT)
    resumed = run(cluster, servers, dispatch, STEPS, resume=tmp_path)
    for name in whole[0]:
        np.testing.assert_array_equal(resumed[0][name], whole[0][name], err_msg=name)
    np.testing.assert_array_equal(resumed[1], whole[1])
    np.testing.assert_array_equal(resumed[2], whole[2])
    # Not vacuous: the checkpoint is not the end state.
    ckpt = Checkpoint(tmp_path)
    assert ckpt.step == CUT
    saved = ckpt.array(ckpt.manifest["dense"][0]["files"]["values"])
    assert not np.array_equal(saved.reshape(-1), whole[0][ckpt.manifest["dense"][0]["name"]].reshape(-1))


def test_checkpoint_holds_every_state_and_positions(cluster, tmp_path):
    run(cluster, 2, "round_robin", 4, ckpt_dir=tmp_path, save_at=4)
    ckpt = Checkpoint(tmp_path)
    m = ckpt.manifest
    assert m["step"] == 4 and m["servers"] == 2 and m["mode"] == "sync"
    assert all(len(d["files"]["slots"]) == 2 and d["version"] == 4 for d in m["dense"])    # Adam: m, v
    (table,) = m["sparse"]
    assert set(table["files"]) >= {"ids", "values", "slot0"}                               # Adagrad: sum
    assert len(ckpt.array(table["files"]["ids"])) == table["rows"] > 0
    for t in range(2):
        pos = ckpt.trainer_position(t)
        assert pos["step"] == 4 and pos["state"] == {"next_batch": 4} and "torch" in pos["rng"]


def test_a_corrupted_or_truncated_file_is_named(cluster, tmp_path):
    run(cluster, 1, "round_robin", 2, ckpt_dir=tmp_path, save_at=2)
    ckpt = Checkpoint(tmp_path)
    rel = ckpt.manifest["dense"][0]["files"]["values"]
    path = ckpt.path / rel
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"{rel}: CRC-32 .* does not match"):
        Checkpoint(tmp_path).array(rel)
    path.write_bytes(bytes(data[:-10]))
    with pytest.raises(CheckpointError, match="truncated"):
        Checkpoint(tmp_path).array(rel)
    (ckpt.path / "manifest.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable manifest"):
        Checkpoint(ckpt.path)


def test_resume_into_another_model_names_the_mismatch(cluster, tmp_path):
    run(cluster, 1, "round_robin", 2, ckpt_dir=tmp_path, save_at=2)
    c = cluster(servers=1, trainers=1)

    class Other(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = ps.SparseEmbedding("feat", DIM, optimizer=ps.optim.Adagrad(lr=0.1), seed=3)
            self.mlp = nn.Sequential(nn.Linear(DIM, 64), nn.ReLU(), nn.Linear(64, 1))

    with pytest.raises(CheckpointError, match=r"parameter mlp.0.weight is \[64, 8\] here, \[32, 8\] in the checkpoint"):
        Trainer(Other(), ps.optim.Adam(lr=0.01), env=c.trainer_env(0), resume=tmp_path)


def test_keep_deletes_old_checkpoints_and_latest_points_at_the_newest(cluster, tmp_path):
    c = cluster(servers=1, trainers=1, checkpoint_dir=str(tmp_path), checkpoint_every=1, checkpoint_keep=2)
    model = Model()
    trainer = Trainer(model, ps.optim.Adam(lr=0.01), env=c.trainer_env(0))
    for k in range(4):
        ids, y = batch(k, 0)
        trainer.step(F.binary_cross_entropy_with_logits(model(ids), y))
    trainer.close()
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step-"))
    assert names == ["step-00000003", "step-00000004"]
    assert json.loads((tmp_path / "latest").read_text()) == {"checkpoint": "step-00000004"}
    assert not list(tmp_path.glob(".tmp-*"))
