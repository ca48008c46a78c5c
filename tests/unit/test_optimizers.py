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


# ---------------------------------------------------------------- row-wise Adagrad (tables only)

def torch_rowwise_adagrad(start, history, lr, eps, initial, weight_decay, scale):
    """Row-wise Adagrad in plain PyTorch (float32): each step updates only the rows it names,
    one accumulator per row grown by the mean of the row gradient's squares."""
    p = torch.from_numpy(start.copy())
    acc = torch.full((p.shape[0], 1), initial, dtype=torch.float32)
    for rows, g in history:
        rows = torch.from_numpy(rows)
        g = torch.from_numpy(g) * scale + weight_decay * p[rows]
        acc[rows] += (g * g).mean(dim=1, keepdim=True)
        p[rows] -= lr * g / (acc[rows].sqrt() + eps)
    return p.numpy(), acc.numpy()


@pytest.mark.parametrize("dim", [1, 4, 16, 33])
@pytest.mark.parametrize("settings", [dict(lr=0.1), dict(lr=0.05, eps=1e-6, initial_accumulator_value=0.1,
                                                         weight_decay=0.01)], ids=["plain", "decay"])
def test_rowwise_adagrad_matches_a_pytorch_implementation(dim, settings):
    config = po.RowWiseAdagrad(**settings)
    rule = make_rule(po.from_wire(config.to_wire()))
    rng = np.random.default_rng(dim)
    n, scale = 50, 0.5
    start = rng.standard_normal((n, dim)).astype(np.float32)
    history = []
    for _ in range(8):                 # each step touches its own rows: rows advance independently
        rows = np.flatnonzero(rng.random(n) < 0.6)
        history.append((rows, rng.standard_normal((len(rows), dim)).astype(np.float32)))
    param, (acc,) = start.copy(), rule.init_slots(start.shape)
    assert acc.shape == (n, 1) and rule.slot_widths(dim) == (1,) and not rule.uses_step
    for rows, g in history:            # as a row store does: gather, update, put back
        values, slots = param[rows], [acc[rows]]
        rule.apply(values, g, slots, step=1, scale=scale)
        param[rows], acc[rows] = values, slots[0]
    expected, expected_acc = torch_rowwise_adagrad(start, history, config.lr, config.eps,
                                                   config.initial_accumulator_value, config.weight_decay, scale)
    np.testing.assert_allclose(acc, expected_acc, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(param, expected, rtol=1e-5, atol=1e-6)
    assert not np.array_equal(param, start)
    untouched = np.setdiff1d(np.arange(n), np.concatenate([rows for rows, _ in history]))
    np.testing.assert_array_equal(param[untouched], start[untouched])


def test_rowwise_adagrad_config_round_trips_and_checks_its_settings():
    config = po.RowWiseAdagrad(lr=0.02, eps=1e-8, initial_accumulator_value=0.5, weight_decay=1e-4)
    wire = config.to_wire()
    assert wire == {"kind": "rowwise_adagrad", "lr": 0.02, "weight_decay": 1e-4, "initial_accumulator_value": 0.5,
                    "eps": 1e-8}
    assert po.from_wire(wire) == config and type(po.from_wire(wire)) is po.RowWiseAdagrad
    assert po.RowWiseAdagrad() == po.RowWiseAdagrad(lr=0.01, eps=1e-10, initial_accumulator_value=0.0,
                                                    weight_decay=0.0)
    import paramshard as ps
    assert ps.optim.RowWiseAdagrad is po.RowWiseAdagrad
    for bad in (dict(lr=0), dict(eps=-1.0), dict(initial_accumulator_value=float("nan"))):
        with pytest.raises(ConfigError):
            po.RowWiseAdagrad(**bad)
    with pytest.raises(ConfigError, match=r"unknown settings \['lr_decay'\]"):
        po.from_wire({**wire, "lr_decay": 0.1})       # no lr_decay: one step size per row, nothing else


def test_rowwise_adagrad_refuses_dense_parameters():
    rule = make_rule(po.RowWiseAdagrad())
    with pytest.raises(ConfigError, match="not a dense parameter"):
        rule.init_slots((100,))
    with pytest.raises(ConfigError, match="not a dense parameter"):
        rule.apply(np.zeros(100, np.float32), np.ones(100, np.float32), [np.zeros(100, np.float32)], 1)
    with pytest.raises(ConfigError, match="RowWiseAdagrad is for SparseEmbedding tables; dense parameters: use Adagrad"):
        po.check_dense(po.RowWiseAdagrad(), "here")
    po.check_dense(po.Adagrad(), "here")
    assert "rowwise_adagrad" not in po.DENSE_KINDS and set(po.DENSE_KINDS) == set(po.KINDS) - {"rowwise_adagrad"}


def test_every_rule_states_its_slot_widths():
    for kind, cls in po.KINDS.items():
        widths = make_rule(cls()).slot_widths(7)
        assert len(widths) == len(make_rule(cls()).slot_names)
        assert widths == ((1,) if kind == "rowwise_adagrad" else (7,) * len(widths))
