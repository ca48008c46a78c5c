"""DCNv2, XDeepFM and AutoInt against their plain-PyTorch twins (twins.py: the papers' maths in
another layout, written apart from paramshard's code), the twin holding copies of the model's
weights: the same logits and the same gradient of every parameter, on one id per field and on
weighted bags. Trained the same way as the CTR app trains them: tests/integration/test_model_twins_training.py."""
import types

import numpy as np
import pytest
import torch
import torch.nn as nn

from paramshard.models import build_model

from tests.unit.models.twins import assert_same_logits_and_gradients, twin_of

F, V, DIM, HIDDEN = 4, 30, 5, (7, 6)
CONFIGS = {
    "dcnv2 full-rank parallel": ("dcnv2", {"cross_layers": 2, "hidden": HIDDEN}),
    "dcnv2 low-rank stacked": ("dcnv2", {"cross_layers": 3, "hidden": HIDDEN, "rank": 3, "structure": "stacked"}),
    "dcnv2 no mlp": ("dcnv2", {"cross_layers": 1, "hidden": (), "structure": "stacked"}),
    "xdeepfm split-half": ("xdeepfm", {"hidden": HIDDEN, "cin_layers": (6, 4, 3)}),
    "xdeepfm direct": ("xdeepfm", {"hidden": (7,), "cin_layers": (5, 3), "split_half": False}),
    "autoint+": ("autoint", {"hidden": HIDDEN, "attention_layers": 2, "heads": 2, "head_dim": 3}),
    "autoint": ("autoint", {"hidden": (), "attention_layers": 3, "heads": 3, "head_dim": 2}),
}


def make(config, num_dense):
    name, kw = CONFIGS[config]
    torch.manual_seed(0)
    model = build_model(name, types.SimpleNamespace(num_dense=num_dense, num_fields=F), dim=DIM,
                        embedding=lambda table, dim: nn.EmbeddingBag(V, dim, mode="sum"), **kw)
    with torch.no_grad():     # nonzero biases, so a dropped bias shows; tables at a CTR model's scale
        for n, p in model.named_parameters():
            p.copy_(0.3 * torch.randn_like(p) if n.startswith(("wide", "deep")) else p + 0.1 * torch.randn_like(p))
    return model


def batch_of(rng, multi: bool, num_dense: int, batch: int = 6):
    dense = torch.from_numpy(rng.standard_normal((batch, num_dense)).astype(np.float32))
    if not multi:
        return dense, torch.from_numpy(rng.integers(0, V, (batch, F))), None, None
    sizes = rng.integers(1, 4, batch * F)
    ids = torch.from_numpy(rng.integers(0, V, int(sizes.sum())))
    offsets = torch.from_numpy(np.cumsum(np.r_[0, sizes[:-1]]))
    weights = torch.from_numpy((1.0 / np.repeat(sizes, sizes)).astype(np.float32))
    return dense, ids, offsets, weights


@pytest.mark.parametrize("num_dense", [3, 0])
@pytest.mark.parametrize("multi", [False, True], ids=["ids[B,F]", "offsets+weights"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_logits_and_every_gradient_equal_the_twins(config, multi, num_dense):
    model = make(config, num_dense)
    twin = twin_of(model)
    assert sum(p.numel() for p in twin.parameters()) == sum(p.numel() for p in model.parameters())
    inputs = batch_of(np.random.default_rng(1), multi, num_dense)
    assert_same_logits_and_gradients(model, twin, inputs, str(config))
