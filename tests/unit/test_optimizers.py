"""Server-side update rules equal torch.optim's on the same gradients."""
import numpy as np
import pytest
import torch

import paramshard.optim as po
from paramshard.errors import ConfigError
from paramshard.update_rules import make_rule

CASES = [
    (po.SGD(lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
    (po.SGD(lr=0.1, weight_decay=0.01), lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=0.01)),
    (po.Momentum(lr=0.1, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
    (po.Momentum(lr=0.1, momentum=0.8, nesterov=True),
     lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.8, nesterov=True)),
    (po.Adagrad(lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1),
     lambda p: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1)),
    (po.Adam(lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
    (po.Adam(lr=0.01, betas=(0.8, 0.99), weight_decay=0.1),
     lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.8, 0.99), weight_decay=0.1)),
]


# Ids from the configs alone (a lambda's repr holds its address, which differs between
# pytest-xdist workers, and they must collect the same ids).
@pytest.mark.parametrize("config,torch_opt", CASES, ids=[repr(config) for config, _ in CASES])
def test_rule_matches_torch(config, torch_opt):
    rng = np.random.default_rng(0)
    n = 100_003    # more than one update chunk, and not a multiple of it
    start = rng.standard_normal(n).astype(np.float32)
    grads = [rng.standard_normal(n).astype(np.float32) for _ in range(6)]
    rule = make_rule(po.from_wire(config.to_wire()))   # through the wire form, as a server gets it
    param, slots = start.copy(), rule.init_slots(start.shape)
    for step, g in enumerate(grads, 1):
        rule.apply(param, g, slots, step)
    tp = torch.nn.Parameter(torch.from_numpy(start.copy()))
    opt = torch_opt([tp])
    for g in grads:
        tp.grad = torch.from_numpy(g)
        opt.step()
    np.testing.assert_allclose(param, tp.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_per_row_steps_for_sparse_rows_match_dense_updates():
    """Rows updated different numbers of times: per-row step counts = separate dense updates."""
    rule = make_rule(po.Adam(lr=0.01))
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((2, 4)).astype(np.float32)
    slots = rule.init_slots(rows.shape)
    steps = np.array([[3], [1]])
    g = rng.standard_normal((2, 4)).astype(np.float32)
    # row 0 has already been updated twice with zero gradients in this made-up history
    ref = rows.copy()
    ref_slots = rule.init_slots((1, 4))
    for s, grad in ((1, np.zeros((1, 4), np.float32)), (2, np.zeros((1, 4), np.float32)), (3, g[:1])):
        rule.apply(ref[:1], grad, ref_slots, s)
    rule.apply(rows, g, slots, steps)
    np.testing.assert_allclose(rows[0], ref[0], rtol=1e-6)


def test_ftrl_keeps_small_weights_at_zero_with_l1():
    rule = make_rule(po.FTRL(lr=0.1, l1=10.0))
    w = np.zeros(5, np.float32)
    slots = rule.init_slots(w.shape)
    rule.apply(w, np.full(5, 0.5, np.float32), slots, 1)
    assert np.all(w == 0)
    rule = make_rule(po.FTRL(lr=0.1, l1=0.0))
    w = np.zeros(5, np.float32)
    slots = rule.init_slots(w.shape)
    rule.apply(w, np.full(5, 0.5, np.float32), slots, 1)
    assert np.all(w < 0)   # moves against the gradient


@pytest.mark.parametrize("bad", [
    lambda: po.SGD(lr=0), lambda: po.SGD(lr=-1), lambda: po.Adam(betas=(0.9, 1.5)),
    lambda: po.from_wire({"kind": "rmsprop"}), lambda: po.from_wire({"kind": "sgd", "lr": 0.1, "oops": 1}),
])
def test_bad_optimizer_settings_are_refused(bad):
    with pytest.raises(ConfigError):
        bad()
