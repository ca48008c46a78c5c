"""AllreduceDenseSync: the dense rule on dense parameters, a table's own rule on the rows a
step touched (as a SparseEmbedding's rows are trained on the servers)."""
import numpy as np
import pytest
import torch

import paramshard as ps
from paramshard.collective.allreduce_sync import AllreduceDenseSync
from paramshard.collective.replicas import tables_with_own_optimizer
from paramshard.errors import ConfigError
from paramshard.models import build_model, hashed_embedding
from paramshard.specs.schema import Column, Label, Schema


@pytest.mark.slow_unit(reason="trains against torch's own Adagrad step by step")
def test_a_table_with_its_own_adagrad_equals_torch_adagrad_on_the_touched_rows():
    rng = np.random.default_rng(0)
    rows, width = 16, 4
    table = rng.normal(size=rows * width).astype(np.float32)
    dense = rng.normal(size=6).astype(np.float32)
    values = {"t.weight": table.copy(), "w": dense.copy()}
    sync = AllreduceDenseSync(ps.optim.SGD(lr=0.1), values, tables={"t.weight": (ps.optim.Adagrad(lr=0.3), width)})
    oracle_t = torch.nn.Parameter(torch.from_numpy(table.copy().reshape(rows, width)))
    oracle_w = torch.nn.Parameter(torch.from_numpy(dense.copy()))
    adagrad, sgd = torch.optim.Adagrad([oracle_t], lr=0.3), torch.optim.SGD([oracle_w], lr=0.1)
    for step in range(5):
        grad_t = np.zeros((rows, width), np.float32)
        touched = rng.choice(rows, 5, replace=False)
        grad_t[touched] = rng.normal(size=(5, width))
        grad_w = rng.normal(size=6).astype(np.float32)
        sync.push_dense({"t.weight": grad_t.ravel(), "w": grad_w}, step, out=values)
        oracle_t.grad, oracle_w.grad = torch.from_numpy(grad_t), torch.from_numpy(grad_w)
        adagrad.step()
        sgd.step()
    np.testing.assert_allclose(values["t.weight"].reshape(rows, width), oracle_t.detach().numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(values["w"], oracle_w.detach().numpy(), rtol=1e-6)


def test_weight_decay_reaches_only_the_rows_a_step_looked_up():
    table = np.ones(8 * 2, np.float32)
    values = {"t.weight": table}
    sync = AllreduceDenseSync(ps.optim.Adam(), values,
                              tables={"t.weight": (ps.optim.Adagrad(lr=0.1, weight_decay=0.5), 2)})
    grad = np.zeros((8, 2), np.float32)
    grad[3] = 1.0
    sync.push_dense({"t.weight": grad.ravel()}, 0, out=values)
    after = values["t.weight"].reshape(8, 2)
    assert np.all(after[np.arange(8) != 3] == 1.0)
    assert np.all(after[3] < 1.0)


def test_an_unknown_table_name_is_refused():
    with pytest.raises(ConfigError, match="not parameters of the model"):
        AllreduceDenseSync(ps.optim.Adam(), {"w": np.zeros(2, np.float32)},
                           tables={"t.weight": (ps.optim.Adagrad(), 2)})


def test_the_models_hashed_tables_declare_their_optimizer():
    schema = Schema(Label("y"), [Column("a", "categorical"), Column("b", "categorical")])
    schema.fields[0].stats = schema.fields[1].stats = {"distinct": 3}
    model = build_model("deepfm", schema, dim=4, hidden=(8,),
                        embedding=hashed_embedding(64, optimizer=ps.optim.Adagrad(lr=0.2)))
    names = {n for n, _ in model.named_parameters()}
    tables = tables_with_own_optimizer(model, names)
    assert set(tables) == {"wide.weight", "deep.weight"}
    assert tables["deep.weight"] == (ps.optim.Adagrad(lr=0.2), 4) and tables["wide.weight"][1] == 1
    plain = build_model("deepfm", schema, dim=4, hidden=(8,), embedding=hashed_embedding(64))
    assert tables_with_own_optimizer(plain, {n for n, _ in plain.named_parameters()}) == {}


def test_a_learning_rate_change_reaches_the_tables_own_rules_too():
    values = {"t.weight": np.ones(4, np.float32)}
    sync = AllreduceDenseSync(ps.optim.Adam(), values, tables={"t.weight": (ps.optim.SGD(lr=0.5), 2)})
    sync.set_lr_scale(0.1)
    sync.push_dense({"t.weight": np.array([1, 1, 0, 0], np.float32)}, 0, out=values)
    np.testing.assert_allclose(values["t.weight"], [0.95, 0.95, 1, 1], rtol=1e-6)
