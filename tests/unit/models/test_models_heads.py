"""Labels beyond binary in the models (issue 32; models/heads.py).

Multi-task: the model's last layers have T outputs over the shared body. Oracles: (1) DeepFM's
T logits computed by hand from its shared body (the field embeddings and the MLP's hidden
layers): per task t, its column of the wide table, its row of the dense term and of the MLP's
last Linear, plus the FM term; (2) for every model, logit t equals a single-task model of the
same class whose shared weights are the multi-task model's and whose head is that model's row t
(the single-task models have a plain-PyTorch oracle in test_models.py); (3) the loss is the mean
over the tasks of each one's binary cross-entropy. Regression: the score is raw * std + mean, the
loss the MSE against the standardised label (MSE in the label's units over std^2)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from paramshard.errors import ConfigError
from paramshard.models import MODELS, build_model
from paramshard.models.heads import LabelHead, head_of
from paramshard.specs.schema import Column, Label, Schema

from tests.unit.models.test_models import KW, VOCAB, Mapped

TASKS = ("click", "buy", "share")
FIELDS = 4


def schema(kind="multitask", sequence=False):
    columns = [Column(f"c{i}", "categorical") for i in range(FIELDS)] + [Column("x"), Column("z")]
    if sequence:        # DIN's behaviour sequence: c1, of c0's items (one id per field here: bags of one)
        columns[1] = Column("c1", "multi", sequence_of="c0")
    if kind == "multitask":
        return Schema(Label(TASKS[0]), columns, label_kind="multitask", labels=[Label(t) for t in TASKS])
    if kind == "regression":
        return Schema(Label("price", stats={"mean": 30.0, "std": 4.0, "count": 10}), columns, label_kind="regression")
    return Schema(Label("click"), columns)


def make(name, kind, seed=0):
    torch.manual_seed(seed)
    model = build_model(name, schema(kind, sequence=name == "din"), embedding=lambda table, dim: Mapped(dim),
                        **KW[name])
    with torch.no_grad():     # nonzero biases, so a dropped bias shows
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def batch(rows=5, seed=1):
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(rows, 2, generator=g)
    ids = VOCAB[torch.randint(0, len(VOCAB), (rows, FIELDS), generator=g)]
    return dense, ids


def test_deepfm_multitask_logits_are_T_heads_over_the_shared_body_by_hand():
    model = make("deepfm", "multitask")
    dense, ids = batch()
    logits = model(dense, ids)
    assert logits.shape == (5, len(TASKS))
    index = torch.searchsorted(VOCAB, ids)                        # [B, F] rows of the mapped tables
    with torch.no_grad():
        v = model.deep.bag.weight[index]                          # [B, F, dim]: the shared embeddings
        x = torch.cat([v.reshape(5, -1), dense], dim=1)
        h = x
        for layer in list(model.mlp)[:-1]:                        # the shared hidden layers
            h = layer(h)
        last, wide = model.mlp[-1], model.wide.bag.weight[index]  # wide: [B, F, T]
        fm = sum((v[:, i] * v[:, j]).sum(1) for i in range(FIELDS) for j in range(i + 1, FIELDS))
        for t in range(len(TASKS)):
            by_hand = (wide[:, :, t].sum(1) + dense @ model.dense_wide.weight[t] + model.dense_wide.bias[t]
                       + h @ last.weight[t] + last.bias[t] + fm)
            torch.testing.assert_close(logits[:, t], by_hand, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_task_is_a_single_task_model_with_that_tasks_head(name):
    multi = make(name, "multitask")
    dense, ids = batch()
    logits = multi(dense, ids)
    state = multi.state_dict()
    for t in range(len(TASKS)):
        single = make(name, "binary", seed=1)
        own = single.state_dict()
        for key, value in own.items():
            full = state[key]
            if full.shape == value.shape:
                own[key] = full                                   # the shared body
            elif full.dim() == 2 and full.shape[1] == len(TASKS) and value.shape[1] == 1:
                own[key] = full[:, t:t + 1]                       # a table's column t (the wide weights)
            else:
                assert full.shape[0] == len(TASKS) and value.shape[0] == 1, key
                own[key] = full[t:t + 1]                          # a last layer's row t
        single.load_state_dict(own)
        torch.testing.assert_close(logits[:, t], single(dense, ids), atol=1e-5, rtol=0)


def test_multitask_scores_and_loss_are_per_task():
    model = make("widedeep", "multitask")
    head = head_of(model)
    assert (head.kind, head.names, head.outputs, model.tasks) == ("multitask", TASKS, 3, 3)
    dense, ids = batch()
    raw = model(dense, ids)
    y = torch.tensor(np.random.default_rng(2).integers(0, 2, (5, 3)), dtype=torch.float32)
    per_task = [F.binary_cross_entropy_with_logits(raw[:, t], y[:, t]) for t in range(3)]
    torch.testing.assert_close(head.loss(raw, y), sum(per_task) / 3)
    w = torch.tensor([1.0, 0.0, 2.0, 1.0, 0.5])
    rows = F.binary_cross_entropy_with_logits(raw, y, reduction="none").mean(1)
    torch.testing.assert_close(head.loss(raw, y, w), (rows * w).mean())
    torch.testing.assert_close(head.scores(raw), torch.sigmoid(raw))


def test_regression_scores_in_the_labels_units_and_trains_on_the_standardised_label():
    model = make("dcn", "regression")
    head = head_of(model)
    assert (head.kind, head.mean, head.std, head.outputs) == ("regression", 30.0, 4.0, 1)
    dense, ids = batch()
    raw = model(dense, ids)
    assert raw.shape == (5,)
    torch.testing.assert_close(head.scores(raw), raw * 4.0 + 30.0)
    y = torch.tensor([28.0, 30.0, 41.0, 25.0, 33.0])
    torch.testing.assert_close(head.loss(raw, y), ((head.scores(raw) - y) ** 2).mean() / 16.0)
    # Without statistics (an unfitted schema): the label as it is.
    assert LabelHead.of_schema(Schema(Label("price"), [Column("c0", "categorical")], label_kind="regression")) \
        == LabelHead("regression", ("price",), 0.0, 1.0)


def test_a_model_without_a_multitask_head_is_refused_with_the_reason():
    from paramshard.models._common import FieldModel

    class Plain(FieldModel):
        pass

    with pytest.raises(ConfigError, match=r"Plain has no multi-task head \(labels click, buy, share\): choose a model"):
        Plain(schema("multitask"), embedding=lambda table, dim: Mapped(dim))
    assert Plain(schema("binary"), embedding=lambda table, dim: Mapped(dim)).tasks == 1
