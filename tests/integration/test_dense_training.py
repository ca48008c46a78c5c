"""Training through real server processes, checked against oracles."""
import copy

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import paramshard as ps
from paramshard.trainer.trainer import Trainer
from tests.conftest import run_in_threads


def make_model(seed=0):
    torch.manual_seed(seed)
    # 64*160 = 10240 weights: one block split over two servers at min_block_size 4096.
    return nn.Sequential(nn.Linear(64, 160), nn.Tanh(), nn.Linear(160, 3))


def make_data(n=384, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 64, generator=g)
    y = torch.randn(n, 3, generator=g)
    return x, y


def train_single_process(model, x, y, batch, steps, torch_opt):
    opt = torch_opt(model.parameters())
    for k in range(steps):
        xb, yb = x[k * batch:(k + 1) * batch], y[k * batch:(k + 1) * batch]
        opt.zero_grad()
        F.mse_loss(model(xb), yb).backward()
        opt.step()
    return model


def train_distributed(cluster, init_model, x, y, batch, steps, ps_opt, trainers=2):
    dataset = torch.utils.data.TensorDataset(x, y)

    def trainer_fn(tid):
        model = copy.deepcopy(init_model)
        if tid != 0:   # only the chief's initial values count: the others must pull them
            for p in model.parameters():
                nn.init.normal_(p)
        trainer = Trainer(model, ps_opt, env=cluster.trainer_env(tid))
        share = ps.shard(dataset, batch_size=batch, trainer_id=tid, num_trainers=trainers)
        loader = torch.utils.data.DataLoader(share, batch_size=batch, shuffle=False)
        for k, (xb, yb) in enumerate(loader):
            if k == steps:
                break
            trainer.step(F.mse_loss(model(xb), yb))
        trainer.close()
        return model

    return run_in_threads([lambda t=t: trainer_fn(t) for t in range(trainers)])


@pytest.mark.parametrize("dispatch", ["round_robin", "balanced", "legacy_v1"])
@pytest.mark.parametrize("ps_opt,torch_opt", [
    (ps.optim.SGD(lr=0.05), lambda p: torch.optim.SGD(p, lr=0.05)),
    (ps.optim.Adam(lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
], ids=["sgd", "adam"])
def test_sync_two_trainers_equal_one_process_with_double_batch(cluster, dispatch, ps_opt, torch_opt):
    c = cluster(servers=2, trainers=2, mode="sync", dispatch=dispatch, min_block_size=4096)
    init = make_model()
    x, y = make_data()
    batch, steps = 16, 10
    reference = train_single_process(copy.deepcopy(init), x, y, 2 * batch, steps, torch_opt)
    models = train_distributed(c, init, x, y, batch, steps, ps_opt)
    for model in models:   # every trainer ends with the reference parameters
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-4, atol=1e-5,
                                       err_msg=f"{dispatch}: parameter {name}")
    # and training did move them, so the comparison is not vacuous
    assert not torch.allclose(next(reference.parameters()), next(init.parameters()))


def test_async_training_converges(cluster):
    c = cluster(servers=2, trainers=2, mode="async", min_block_size=4096)
    torch.manual_seed(0)
    w_true = torch.randn(64, 3)
    x = torch.randn(1024, 64)
    y = x @ w_true
    init = make_model()
    before = F.mse_loss(init(x), y).item()
    models = train_distributed(c, init, x, y, batch=32, steps=16, ps_opt=ps.optim.Adam(lr=0.01))
    after = F.mse_loss(models[0](x), y).item()
    assert after < 0.5 * before, (before, after)


def test_servers_hold_exactly_what_trainers_pushed(cluster):
    """Async SGD with lr=1 on zero-initialised parameters: value = -(sum of pushes)."""
    c = cluster(servers=2, trainers=2, mode="async", min_block_size=1024)
    rng = np.random.default_rng(0)
    shapes = {"a": (300, 10), "b": (5000,), "c": (7,)}
    pushes = {t: [{n: rng.standard_normal(int(np.prod(s))).astype(np.float32) for n, s in shapes.items()}
                  for _ in range(3)] for t in range(2)}

    class Zeros(nn.Module):
        def __init__(self):
            super().__init__()
            for n, s in shapes.items():
                self.register_parameter(n, nn.Parameter(torch.zeros(s)))

    def trainer_fn(tid):
        model = Zeros()
        trainer = Trainer(model, ps.optim.SGD(lr=1.0), env=c.trainer_env(tid))
        for grads in pushes[tid]:
            for n, p in model.named_parameters():
                p.grad = torch.from_numpy(grads[n]).view(p.shape).clone()
            trainer.step()
        return trainer

    trainers = run_in_threads([lambda t=t: trainer_fn(t) for t in range(2)])
    chief = trainers[0]
    chief.pull()
    for n, p in chief.model.named_parameters():
        expected = -sum(g[n] for t in range(2) for g in pushes[t])
        np.testing.assert_allclose(p.detach().numpy().ravel(), expected, rtol=1e-5, atol=1e-5)
    stats = chief.server_stats()
    assert sum(s["dense_elements"] for s in stats) == sum(int(np.prod(s)) for s in shapes.values())
    assert all(s["errors"] == 0 for s in stats)
    for t in trainers:
        t.close()
