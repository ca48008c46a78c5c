"""DIN (models/din.py) against its plain-PyTorch twin (twins.TwinDIN: row by row, one lookup per
position), and what its attention is and is not sensitive to: padding, order, truncation."""
import copy
import types

import numpy as np
import pytest
import torch
import torch.nn as nn

from paramshard.errors import ConfigError
from paramshard.models import build_from_spec, build_model, hashed_embedding
from paramshard.models.din import positions
from paramshard.trainer.sparse_embedding import input_key

from tests.unit.models.twins import assert_same_logits_and_gradients, twin_of

F, V, DIM = 4, 30, 5
SEQ, CAND = 2, 0          # field 2 is the behaviour sequence of field 0


def make(num_dense=3, max_len=4, pairs=((SEQ, CAND),), **kw):
    torch.manual_seed(0)
    schema = types.SimpleNamespace(num_dense=num_dense, num_fields=F, sequences=list(pairs))
    model = build_model("din", schema, dim=DIM, hidden=kw.pop("hidden", (7, 6)), attention_hidden=(6, 3),
                        max_len=max_len, embedding=lambda table, dim: nn.EmbeddingBag(V, dim, mode="sum"), **kw)
    with torch.no_grad():     # nonzero biases and PReLU slopes apart, tables at a CTR model's scale
        for n, p in model.named_parameters():
            p.copy_(0.3 * torch.randn_like(p) if n.startswith(("wide", "deep")) else p + 0.1 * torch.randn_like(p))
    return model


def bags(rng, sizes, num_dense=3):
    """Inputs with bag sizes [B, F] (the encoder's 1/len weights)."""
    sizes = np.asarray(sizes).reshape(-1)
    dense = torch.from_numpy(rng.standard_normal((len(sizes) // F, num_dense)).astype(np.float32))
    ids = torch.from_numpy(rng.integers(0, V, int(sizes.sum())))
    offsets = torch.from_numpy(np.cumsum(np.r_[0, sizes[:-1]]))
    weights = torch.from_numpy((1.0 / np.repeat(sizes, sizes)).astype(np.float32))
    return dense, ids, offsets, weights


def sizes_of(rng, batch=6):
    """Single ids but the sequence field (and field 3, another bag); sequences of 1..7 positions,
    so some are cut to max_len=4 and some padded."""
    s = np.ones((batch, F), np.int64)
    s[:, SEQ] = rng.integers(1, 8, batch)
    s[:, 3] = rng.integers(1, 3, batch)
    return s


@pytest.mark.parametrize("num_dense", [3, 0])
@pytest.mark.parametrize("shape", ["bags", "ids[B,F]", "two sequences"])
def test_logits_and_every_gradient_equal_the_twins(shape, num_dense):
    rng = np.random.default_rng(1)
    pairs = ((SEQ, CAND), (3, 1)) if shape == "two sequences" else ((SEQ, CAND),)
    model = make(num_dense, pairs=pairs)
    twin = twin_of(model)
    assert sum(p.numel() for p in twin.parameters()) == sum(p.numel() for p in model.parameters())
    if shape == "ids[B,F]":
        inputs = (torch.randn(6, num_dense), torch.from_numpy(rng.integers(0, V, (6, F))), None, None)
    else:
        inputs = bags(rng, sizes_of(rng), num_dense)
    assert_same_logits_and_gradients(model, twin, inputs, str(shape))
    # The attention is trained: its first layer's gradient is not zero.
    assert model.attention[0].mlp[0].weight.grad.abs().max() > 0


def test_positions_keep_the_order_pad_with_zeros_and_cut_to_the_most_recent():
    rows = torch.arange(1.0, 8.0).unsqueeze(1)                      # ids 0..6 -> rows 1..7
    seq, mask = positions(rows, start=torch.tensor([0, 2]), count=torch.tensor([2, 5]), max_len=3)
    assert seq[:, :, 0].tolist() == [[1.0, 2.0, 0.0], [5.0, 6.0, 7.0]]     # order kept; the last 3 of 5
    assert mask.tolist() == [[True, True, False], [True, True, True]]


def test_padding_changes_nothing_order_only_through_truncation():
    rng = np.random.default_rng(2)
    sizes = sizes_of(rng)
    dense, ids, offsets, weights = bags(rng, sizes)
    short = make(max_len=7)                          # every sequence fits: only padding differs below
    longer = copy.deepcopy(short)
    longer.max_len = 40                              # 33 more padded positions per row
    torch.testing.assert_close(short(dense, ids, offsets, weights), longer(dense, ids, offsets, weights),
                               atol=1e-6, rtol=1e-6)

    def reversed_sequences(ids):
        out = ids.clone()
        for b in range(len(sizes)):
            k = b * F + SEQ
            lo = int(offsets[k])
            out[lo:lo + sizes[b, SEQ]] = ids[lo:lo + sizes[b, SEQ]].flip(0)
        return out
    flipped = reversed_sequences(ids)
    assert not torch.equal(flipped, ids)
    # No position term (the paper has none): a whole history read backwards scores the same ...
    torch.testing.assert_close(short(dense, flipped, offsets, weights), short(dense, ids, offsets, weights),
                               atol=1e-6, rtol=1e-6)
    # ... but with max_len=4 the most recent 4 are kept: reversed, the rows longer than 4 keep others.
    cut = make(max_len=4)
    changed = (cut(dense, flipped, offsets, weights) - cut(dense, ids, offsets, weights)).abs() > 1e-6
    long_rows = torch.from_numpy(sizes[:, SEQ] > 4)
    assert long_rows.any() and (~long_rows).any()
    assert torch.equal(changed, long_rows & changed) and changed.any()


def test_din_without_a_sequence_in_the_schema_is_refused_with_the_flag_to_add_one():
    with pytest.raises(ConfigError, match="--sequence hist_item_ids:item_id"):
        make(pairs=())
    with pytest.raises(ConfigError, match="max_len"):
        make(max_len=0)


def test_the_spec_rebuilds_the_same_network_from_the_schema():
    from paramshard.specs.schema import Column, Label, Schema
    schema = Schema(Label("y"), [Column("item_id", "categorical"), Column("x"),
                                 Column("hist", "multi", sequence_of="item_id")])
    assert schema.sequences == [(1, 0)]
    torch.manual_seed(0)
    model = build_model("din", schema, dim=3, hidden=(4,), max_len=5, embedding=hashed_embedding(64))
    spec = model.paramshard_spec
    assert spec["args"] == {"dim": 3, "hidden": [4], "attention_hidden": [36], "max_len": 5, "prefix": ""}
    assert spec["schema"]["columns"][2]["sequence_of"] == "item_id"
    again = build_from_spec(spec)
    assert again.pairs == [(1, 0)] and again.max_len == 5
    again.load_state_dict(model.state_dict())           # collective mode's tables: dense, in the state
    # Rows (item, history of 3) and (item, history of 7): 64-bit ids, some negative.
    ids = torch.arange(1, 13) * -0x61C8864680B583EB
    dense, offsets, weights = torch.randn(2, 1), torch.tensor([0, 1, 4, 5]), torch.ones(12)
    want = model(dense, ids, offsets, weights)
    assert torch.isfinite(want).all() and want.std() > 0
    torch.testing.assert_close(again(dense, ids, offsets, weights), want, rtol=0, atol=0)


class Recorder(nn.EmbeddingBag):
    """Records the memory each call's ids live in (what the prefetcher matches)."""

    def __init__(self, dim):
        super().__init__(V, dim, mode="sum")
        self.keys = []

    def forward(self, ids, offsets=None, per_sample_weights=None):
        self.keys.append(input_key(ids))
        return super().forward(ids, offsets, per_sample_weights=per_sample_weights)


def test_each_table_is_looked_up_once_with_the_batchs_own_ids():
    schema = types.SimpleNamespace(num_dense=3, num_fields=F, sequences=[(SEQ, CAND)])
    model = build_model("din", schema, dim=DIM, embedding=lambda table, dim: Recorder(dim))
    inputs = bags(np.random.default_rng(4), sizes_of(np.random.default_rng(4)))
    model(*inputs)
    assert model.wide.keys == model.deep.keys == [input_key(inputs[1])]


def test_the_app_takes_max_len_for_din_only():
    from paramshard.apps.ctr.options import parser, resolve
    common = ["--train", "t", "--test", "s", "--schema", "x"]
    a = resolve(parser("ctr").parse_args(common + ["--model", "din", "--max-len", "20"]))
    assert a.architecture == {"dim": 16, "hidden": (200, 80), "attention_hidden": (36,), "max_len": 20}
    assert resolve(parser("ctr").parse_args(common + ["--model", "din"])).architecture["max_len"] == 50
    with pytest.raises(ConfigError, match="only DIN has a sequence to cut"):
        resolve(parser("ctr").parse_args(common + ["--model", "deepfm", "--max-len", "20"]))
    with pytest.raises(ConfigError, match="must be >= 1"):
        resolve(parser("ctr").parse_args(common + ["--model", "din", "--max-len", "0"]))
