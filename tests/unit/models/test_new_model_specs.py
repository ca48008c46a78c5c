"""DCNv2, XDeepFM and AutoInt as a model file and `paramshard predict` meet them: build_model
records every architecture argument (the class's defaults filled in), and the module built
again from that spec, through JSON, with the servers' tables or the hashed ones of collective
mode, has the same parameters and, given the same values, the same logits. Plus the CTR
app's options: each takes the deep models' defaults and names what it builds."""
import json

import numpy as np
import pytest
import torch

import paramshard as ps
from paramshard.apps.ctr.options import describe, parser, resolve
from paramshard.errors import ConfigError
from paramshard.models import build_from_spec, build_model, hashed_embedding
from paramshard.models.defaults import TRAINING, TrainingDefaults
from paramshard.specs.model_spec import check_spec
from paramshard.specs.schema import Column, Label, Schema
from paramshard.trainer.sparse_embedding import tables_of

SCHEMA = Schema(Label("y"), [Column("x"), Column("c", "categorical"), Column("d", "categorical")])
RECORDED = {
    "dcnv2": ({"dim": 3, "hidden": (5,), "rank": 2, "structure": "stacked"},
              {"dim": 3, "cross_layers": 3, "hidden": [5], "rank": 2, "structure": "stacked", "prefix": ""}),
    "xdeepfm": ({"dim": 3, "hidden": (5,), "cin_layers": (4, 2)},
                {"dim": 3, "hidden": [5], "cin_layers": [4, 2], "split_half": True, "prefix": ""}),
    "autoint": ({"dim": 3, "hidden": (), "heads": 3},
                {"dim": 3, "hidden": [], "attention_layers": 3, "heads": 3, "head_dim": 8, "prefix": ""}),
}


def through_json(spec):
    return check_spec(json.loads(json.dumps(spec)))


def shapes(model):
    return {n: list(p.shape) for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", list(RECORDED))
def test_the_spec_records_every_argument_and_builds_the_model_again(name):
    kw, args = RECORDED[name]
    model = build_model(name, SCHEMA, table_optimizer=ps.optim.Adagrad(lr=0.5), capacity=100, **kw)
    assert model.paramshard_spec == {"model": name, "args": args, "schema": SCHEMA.to_dict()}
    again = build_from_spec(through_json(model.paramshard_spec))
    assert type(again) is type(model) and shapes(again) == shapes(model)
    assert {n: t.dim for n, t in tables_of(again).items()} == {"wide": 1, "deep": 3}


@pytest.mark.parametrize("name", list(RECORDED))
def test_with_hashed_tables_the_rebuilt_module_computes_what_the_original_does(name):
    torch.manual_seed(0)
    model = build_model(name, SCHEMA, embedding=hashed_embedding(16), **RECORDED[name][0])
    assert not tables_of(model)          # collective mode: every parameter dense, nothing on servers
    again = build_from_spec(through_json(model.paramshard_spec))
    again.load_state_dict(model.state_dict())
    dense, ids = torch.randn(5, 1), torch.from_numpy(np.random.default_rng(0).integers(-2**62, 2**62, (5, 2)))
    want = model(dense, ids)
    assert torch.isfinite(want).all() and want.std() > 0
    torch.testing.assert_close(again(dense, ids), want, rtol=0, atol=0)


@pytest.mark.parametrize("name", list(RECORDED))
def test_the_app_takes_the_deep_models_defaults_and_says_what_it_builds(name):
    a = resolve(parser("ctr").parse_args(["--train", "t", "--test", "s", "--schema", "x", "--model", name,
                                          "--dim", "8", "--hidden", "32"]))
    assert TRAINING[name] == TrainingDefaults() and (a.lr, a.table_lr) == (3e-3, 0.05)
    assert a.architecture["dim"] == 8 and a.architecture["hidden"] == (32,)
    built = build_model(name, SCHEMA, embedding=hashed_embedding(16), **a.architecture)
    assert {k: v for k, v in built.paramshard_spec["args"].items() if k != "prefix"} == \
        {k: list(v) if isinstance(v, tuple) else v for k, v in a.architecture.items()}
    assert f"{name} (dim 8, " in describe(a)


@pytest.mark.parametrize("name, kw, message", [
    ("dcnv2", {"rank": -1}, "rank must be a whole number >= 0"),
    ("dcnv2", {"structure": "serial"}, "structure must be one of parallel, stacked"),
    ("dcnv2", {"cross_layers": 0}, "cross_layers must be"),
    ("xdeepfm", {"cin_layers": (3, 2)}, "every CIN width but the last must be even"),
    ("xdeepfm", {"cin_layers": ()}, "cin_layers must be widths >= 1"),
    ("autoint", {"heads": 0}, "heads must be a whole number >= 1"),
    ("autoint", {"attention_layers": 1.5}, "attention_layers must be"),
])
def test_bad_architecture_arguments_are_named(name, kw, message):
    with pytest.raises(ConfigError, match=message):
        build_model(name, SCHEMA, embedding=hashed_embedding(16), **kw)
