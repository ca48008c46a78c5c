"""An async checkpoint is one consistent cut: for every trainer, the same steps on every server.

Three async trainers push integer gradients (SGD, lr 1: exact in float32) to
dense blocks spread over two servers and to a sparse table, while the chief
saves. What the checkpoint holds must equal the initial values minus the sum of
every trainer's gradients up to the cut the manifest records: a push that one
server applied and another did not would break the equality.
"""
import time

import numpy as np
import torch
import torch.nn as nn

import paramshard as ps
from paramshard.checkpoint.format import Checkpoint
from paramshard.trainer.trainer import Trainer
from tests.conftest import run_in_threads

SHAPES = {"a": (40, 10), "b": (300,)}
STEPS, SAVE_AT, TRAINERS, VOCAB = 40, 8, 3, 50


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        for name, shape in SHAPES.items():
            self.register_parameter(name, nn.Parameter(torch.zeros(shape)))
        self.emb = ps.SparseEmbedding("t", 4, optimizer=ps.optim.SGD(lr=1.0), init_scale=0.0)


def pushes(trainer, step):
    g = np.random.default_rng(10_000 * trainer + step)
    dense = {n: g.integers(-3, 4, s).astype(np.float32) for n, s in SHAPES.items()}
    return dense, g.integers(0, VOCAB, 8)


def test_async_checkpoint_is_one_cut_on_every_server(cluster, tmp_path):
    c = cluster(servers=2, trainers=TRAINERS, mode="async", min_block_size=64)
    models = [Model() for _ in range(TRAINERS)]
    done = [0] * TRAINERS          # steps each trainer has taken

    def trainer_fn(tid):
        model = models[tid]
        trainer = Trainer(model, ps.optim.SGD(lr=1.0), env=c.trainer_env(tid))
        for k in range(STEPS):
            dense, ids = pushes(tid, k)
            model.emb(torch.from_numpy(ids).view(1, -1)).sum().backward()   # row gradient: occurrences
            for n, p in model.named_parameters():
                if n in SHAPES:
                    p.grad = torch.from_numpy(dense[n])
            trainer.step()
            done[tid] = k + 1
            if tid == 0 and k == SAVE_AT:
                # The others must be mid-run when the save starts (threads start at different
                # times; a fast chief could otherwise save before they pushed anything).
                deadline = time.monotonic() + 30
                while min(done[1:]) < 2 and time.monotonic() < deadline:
                    time.sleep(0.001)
                trainer.save(tmp_path)
            elif tid != 0:
                time.sleep(0.002)
        return trainer

    trainers = run_in_threads([lambda t=t: trainer_fn(t) for t in range(TRAINERS)], timeout=120)
    for t in trainers:
        t.close()

    ckpt = Checkpoint(tmp_path / "step-00000009")
    cut = {int(t): k for t, k in ckpt.manifest["cut"].items()}
    assert cut[0] == SAVE_AT
    assert any(0 < cut[t] < STEPS - 1 for t in range(1, TRAINERS)), f"no load during the save: {cut}"
    expected = {n: np.zeros(int(np.prod(s)), np.float32) for n, s in SHAPES.items()}
    counts = np.zeros(VOCAB, np.float32)
    for t, last in cut.items():
        for k in range(last + 1):
            dense, ids = pushes(t, k)
            for n in SHAPES:
                expected[n] -= dense[n].reshape(-1)
            np.add.at(counts, ids, 1)
    for entry in ckpt.manifest["dense"]:
        np.testing.assert_array_equal(ckpt.array(entry["files"]["values"]), expected[entry["name"]],
                                      err_msg=entry["name"])
    (table,) = ckpt.manifest["sparse"]
    ids = ckpt.array(table["files"]["ids"]).astype(np.int64)
    values = ckpt.array(table["files"]["values"])
    np.testing.assert_array_equal(values, -np.repeat(counts[ids][:, None], 4, axis=1))
