"""paramshard.models. Oracle: an independent plain-PyTorch reference of each paper's maths,
written here with explicit loops (each bag summed id by id, the FM term over field pairs
i < j, the cross layers one by one), fed copies of the model's weights: logits and the
gradient of every parameter must agree. Training with the real SparseEmbedding:
tests/integration/test_models_training.py."""
import types

import numpy as np
import pytest
import torch
import torch.nn as nn

from paramshard.errors import ConfigError
from paramshard.models import (DCN, MODELS, AutoInt, DCNv2, DeepFM, LogisticRegression, WideDeep, XDeepFM,
                               build_model)
from paramshard.trainer.sparse_embedding import input_key, tables_of

F, V, DIM, HIDDEN, CROSS = 4, 40, 5, (7, 6), 2
# Field-distinct 64-bit hashes, negative ones included (uint64 bit patterns), sorted for searchsorted.
VOCAB = torch.from_numpy(np.sort(np.random.default_rng(7).integers(-2**63, 2**63 - 1, V, dtype=np.int64)))
KW = {"lr": {}, "widedeep": {"dim": DIM, "hidden": HIDDEN}, "deepfm": {"dim": DIM, "hidden": HIDDEN},
      "dcn": {"dim": DIM, "hidden": HIDDEN, "cross_layers": CROSS},
      "dcnv2": {"dim": DIM, "hidden": HIDDEN, "cross_layers": CROSS, "rank": 2},
      "xdeepfm": {"dim": DIM, "hidden": HIDDEN, "cin_layers": (4, 3)},
      "autoint": {"dim": DIM, "hidden": HIDDEN, "attention_layers": 2, "heads": 2, "head_dim": 3},
      "din": {"dim": DIM, "hidden": HIDDEN, "attention_hidden": (3,), "max_len": 3}}
# DIN's behaviour sequence (field 1, candidate field 0); the other models do not read it.
SEQUENCES = [(1, 0)]
# The models whose reference is below; the newer ones' (plain-PyTorch modules): twins.py.
REFERENCED = ("lr", "widedeep", "deepfm", "dcn")


class Mapped(nn.Module):
    """nn.EmbeddingBag(V, dim, sum) over the hashes mapped to 0..V-1; records each call."""

    def __init__(self, dim):
        super().__init__()
        self.bag = nn.EmbeddingBag(V, dim, mode="sum")
        self.inputs = []

    def forward(self, ids, offsets=None, per_sample_weights=None):
        self.inputs.append(input_key(ids))
        index = torch.searchsorted(VOCAB, ids)
        assert torch.equal(VOCAB[index], ids)
        return self.bag(index, offsets, per_sample_weights=per_sample_weights)


def make(name, num_dense):
    torch.manual_seed(0)
    model = build_model(name, types.SimpleNamespace(num_dense=num_dense, num_fields=F, sequences=SEQUENCES),
                        embedding=lambda table, dim: Mapped(dim), **KW[name])
    with torch.no_grad():     # nonzero biases, so a dropped bias shows
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def random_bags(rng, batch, max_bag):
    """bags[b][f] = [(vocab index, weight)], weights 1/len(bag) (a bag is the mean of its ids)."""
    bags = []
    for _ in range(batch):
        sample = []
        for _ in range(F):
            size = int(rng.integers(1, max_bag + 1))
            sample.append([(int(i), 1.0 / size) for i in rng.integers(0, V, size)])
        bags.append(sample)
    return bags


def bag_form(bags):
    flat = [(i, w) for sample in bags for bag in sample for i, w in bag]
    sizes = [len(bag) for sample in bags for bag in sample]
    return (VOCAB[torch.tensor([i for i, _ in flat])], torch.tensor(np.cumsum([0] + sizes[:-1])),
            torch.tensor([w for _, w in flat], dtype=torch.float32))


# -- the reference: the papers' maths, spelled out --------------------------------------------------
def rows(table, bags):
    """[B, F, k]: each bag's weighted sum, id by id."""
    return torch.stack([torch.stack([sum(w * table[i] for i, w in bag) for bag in sample]) for sample in bags])


def linear(P, dense, bags):
    wide = rows(P["wide.bag.weight"], bags)[:, :, 0].sum(1)
    if "dense_wide.weight" in P:
        wide = wide + (dense * P["dense_wide.weight"][0]).sum(1)
    return wide + P["dense_wide.bias"][0]


def tower(P, x, layers, final):
    for i in range(layers):
        x = torch.relu(x @ P[f"mlp.{2 * i}.weight"].T + P[f"mlp.{2 * i}.bias"])
    return x @ P[f"mlp.{2 * layers}.weight"][0] + P[f"mlp.{2 * layers}.bias"][0] if final else x


def fm_pairs(v):
    return sum((v[:, i] * v[:, j]).sum(1) for i in range(F) for j in range(i + 1, F))


def reference(name, P, dense, bags):
    out = linear(P, dense, bags)
    if name == "lr":
        return out
    v = rows(P["deep.bag.weight"], bags)
    x0 = torch.cat([v.flatten(1), dense], 1)
    if name in ("widedeep", "deepfm"):
        out = out + tower(P, x0, len(HIDDEN), final=True)
    if name == "deepfm":
        out = out + fm_pairs(v)
    if name == "dcn":
        x = x0
        for layer in range(CROSS):
            x = x0 * torch.einsum("bw,w->b", x, P["cross_w"][layer])[:, None] + P["cross_b"][layer] + x
        both = torch.cat([x, tower(P, x0, len(HIDDEN), final=False)], 1)
        out = out + both @ P["head.weight"][0] + P["head.bias"][0]
    return out


@pytest.mark.parametrize("num_dense", [3, 0])
@pytest.mark.parametrize("multi", [False, True], ids=["ids[B,F]", "offsets+weights"])
@pytest.mark.parametrize("name", REFERENCED)
def test_logits_and_every_gradient_match_the_reference(name, multi, num_dense):
    rng = np.random.default_rng(1)
    model, batch = make(name, num_dense), 5
    bags = random_bags(rng, batch, max_bag=3 if multi else 1)
    dense = torch.from_numpy(rng.standard_normal((batch, num_dense)).astype(np.float32))
    if multi:
        ids, offsets, weights = bag_form(bags)
        assert len(ids) > batch * F     # some field really is multi-valued
    else:
        ids, offsets, weights = VOCAB[torch.tensor([[bag[0][0] for bag in s] for s in bags])], None, None
    P = {n: p.detach().clone().requires_grad_() for n, p in model.named_parameters()}
    upstream = torch.randn(batch)

    logits = model(dense, ids, offsets, weights)
    expected = reference(name, P, dense, bags)
    assert logits.shape == (batch,) and logits.dtype == torch.float32
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    (logits * upstream).sum().backward()
    (expected * upstream).sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, P[n].grad, atol=1e-5, rtol=1e-5, msg=lambda m: f"{name} {n}: {m}")
    # Each table looked up ONCE, with the batch's own ids tensor (the prefetcher matches its memory).
    for table in tables_of_mapped(model):
        assert table.inputs == [input_key(ids)]


def tables_of_mapped(model):
    tables = [m for m in model.modules() if isinstance(m, Mapped)]
    assert len(tables) == (1 if isinstance(model, LogisticRegression) else 2)
    return tables


@pytest.mark.parametrize("name", list(MODELS))
def test_bags_of_one_id_give_the_logits_of_one_id_per_field(name):
    model = make(name, 3)
    ids = VOCAB[torch.randint(0, V, (6, F))]
    dense = torch.randn(6, 3)
    offsets = torch.arange(6 * F)
    one_per_field = model(dense, ids)
    torch.testing.assert_close(model(dense, ids.reshape(-1), offsets), one_per_field, atol=1e-6, rtol=0)
    torch.testing.assert_close(model(dense, ids.reshape(-1), offsets, torch.ones(6 * F)), one_per_field,
                               atol=1e-6, rtol=0)


def test_build_model_by_name_and_unknown_names():
    schema = types.SimpleNamespace(num_dense=2, num_fields=3)
    emb = lambda table, dim: nn.EmbeddingBag(10, dim, mode="sum")     # noqa: E731
    for name, cls in [("lr", LogisticRegression), ("widedeep", WideDeep), ("deepfm", DeepFM), ("dcn", DCN),
                      ("dcnv2", DCNv2), ("xdeepfm", XDeepFM), ("autoint", AutoInt)]:
        model = build_model(name, schema, embedding=emb, **KW[name])
        assert type(model) is cls and (model.num_dense, model.num_fields) == (2, 3)
        assert "num_dense=2, num_fields=3" in repr(model)
    assert build_model("dcn", schema, embedding=emb, dim=3).deep.embedding_dim == 3
    with pytest.raises(ConfigError, match="unknown model 'fm'.*autoint, dcn, dcnv2, deepfm, din, lr, widedeep, xdeepfm"):
        build_model("fm", schema)


@pytest.mark.parametrize("name", list(MODELS))
def test_wrong_input_shapes_name_expected_and_got(name):
    model, B = make(name, 3), 4
    ids, dense = VOCAB[torch.randint(0, V, (B, F))], torch.randn(B, 3)
    with pytest.raises(ConfigError, match=r"ids must be \[B, num_fields\] = \[4, 4\].*got \[4, 5\]"):
        model(dense, VOCAB[torch.randint(0, V, (B, F + 1))])
    with pytest.raises(ConfigError, match=r"ids must be .*got \[3, 4\]"):       # batch differs from dense's
        model(dense, ids[:3])
    with pytest.raises(ConfigError, match=r"dense must be \[B, 3\].*got \[4, 2\]"):
        model(dense[:, :2], ids)
    with pytest.raises(ConfigError, match=r"offsets must be \[B \* num_fields\] = \[16\].*got \[15\]"):
        model(dense, ids.reshape(-1), torch.arange(B * F - 1))
    with pytest.raises(ConfigError, match=r"weights must be one per id, \[16\], got \[3\]"):
        model(dense, ids.reshape(-1), torch.arange(B * F), torch.ones(3))


def test_default_tables_are_sparse_embeddings_named_wide_and_deep():
    schema = types.SimpleNamespace(num_dense=1, num_fields=2)
    assert set(tables_of(LogisticRegression(schema))) == {"wide"}
    for cls in (WideDeep, DeepFM, DCN, DCNv2, XDeepFM, AutoInt):
        assert set(tables_of(cls(schema, dim=3, hidden=(4,)))) == {"wide", "deep"}
