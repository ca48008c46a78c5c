"""specs/model_spec.py and what build_model records. Oracle: the module built again from the
recorded spec (through JSON, as a manifest or model file carries it) has the same
architecture as the one build_model made: the same parameter names and shapes, the
same tables, the same forward once it holds the same values."""
import json
import types

import numpy as np
import pytest
import torch
import torch.nn as nn

from paramshard.specs.schema import Column, Label, Schema
from paramshard.errors import ConfigError
from paramshard.specs.model_spec import SpecError, check_spec, make_spec, spec_of
from paramshard.models import MODELS, build_from_spec, build_model, hashed_embedding
from paramshard.trainer.sparse_embedding import tables_of
import paramshard as ps

SCHEMA = Schema(Label("y"), [Column("x"), Column("c", "categorical"), Column("d", "categorical")])


def shapes(model) -> dict:
    return {n: list(p.shape) for n, p in model.named_parameters()}


def through_json(spec: dict) -> dict:
    return check_spec(json.loads(json.dumps(spec)))


@pytest.mark.parametrize("name,kw,args", [
    ("lr", {}, {"prefix": ""}),
    ("widedeep", {"dim": 3, "hidden": (5,)}, {"dim": 3, "hidden": [5], "prefix": ""}),
    ("DeepFM", {"dim": 3}, {"dim": 3, "hidden": list(MODELS["deepfm"].__init__.__defaults__[1]), "prefix": ""}),
    ("dcn", {"dim": 2, "cross_layers": 1, "hidden": [4], "prefix": "ad_"},
     {"dim": 2, "cross_layers": 1, "hidden": [4], "prefix": "ad_"}),
])
def test_build_model_records_the_architecture_and_the_spec_builds_it_again(name, kw, args):
    model = build_model(name, SCHEMA, table_optimizer=ps.optim.Adagrad(lr=0.5), capacity=1000, **kw)
    spec = model.paramshard_spec
    # Defaults filled in (a later default cannot change what a file means); how it trains left out.
    assert spec == {"model": name.lower(), "args": args, "schema": SCHEMA.to_dict()}
    again = build_from_spec(through_json(spec))
    assert type(again) is type(model) and shapes(again) == shapes(model)
    assert {n: t.dim for n, t in tables_of(again).items()} == {n: t.dim for n, t in tables_of(model).items()}
    assert again.paramshard_spec == spec


def test_the_rebuilt_module_computes_what_the_original_does():
    torch.manual_seed(0)
    model = build_model("deepfm", SCHEMA, embedding=hashed_embedding(16), dim=3, hidden=[4])
    assert model.paramshard_spec["embedding"] == {"kind": "hashed", "buckets": 16, "init_scale": 0.01}
    again = build_from_spec(through_json(model.paramshard_spec))
    again.load_state_dict(model.state_dict())
    dense, ids = torch.randn(5, 1), torch.from_numpy(np.random.default_rng(0).integers(-2**62, 2**62, (5, 2)))
    torch.testing.assert_close(again(dense, ids), model(dense, ids), rtol=0, atol=0)


def test_models_that_cannot_be_written_down_record_no_spec():
    own_tables = build_model("lr", SCHEMA, embedding=lambda name, dim: nn.EmbeddingBag(10, dim))
    stand_in = build_model("lr", types.SimpleNamespace(num_dense=1, num_fields=2),
                           embedding=hashed_embedding(8))
    assert not hasattr(own_tables, "paramshard_spec") and not hasattr(stand_in, "paramshard_spec")
    assert spec_of(own_tables) is None


def test_a_users_own_model_is_built_only_from_classes_the_caller_names():
    class Mine(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.lin = nn.Linear(width, 1)

    spec = make_spec("mine", {"width": 3})
    assert "schema" not in spec
    assert shapes(build_from_spec(spec, classes={"mine": Mine})) == {"lin.weight": [1, 3], "lin.bias": [1]}
    with pytest.raises(ConfigError, match=r"the recorded model 'mine' is not one paramshard builds .*"
                                          r"classes=\{'mine': YourModel\}"):
        build_from_spec(spec)
    with pytest.raises(ConfigError, match=r"cannot be built with \['dim', 'nope'\]"):
        build_from_spec({**build_model("widedeep", SCHEMA, dim=2).paramshard_spec,
                         "args": {"dim": 2, "nope": 1}})


@pytest.mark.parametrize("spec,message", [
    ([], "must be an object, got list"),
    ({"model": "", "args": {}}, "'model' must be a non-empty name"),
    ({"model": "lr", "args": []}, "'args' must be an object"),
    ({"model": "lr", "args": {}, "module": "os"}, "unknown key 'module'"),
    ({"model": "lr", "args": {}, "schema": {"label": "y", "columns": [{"name": "x", "kind": "text"}]}},
     "kind must be one of"),
    ({"model": "lr", "args": {}, "embedding": {"kind": "hashed", "buckets": 6, "init_scale": 0.1}},
     "buckets must be a power of two"),
    ({"model": "lr", "args": {}, "embedding": {"kind": "hashed", "buckets": 8, "init_scale": float("nan")}},
     "init_scale must be a number"),
    ({"model": "lr", "args": {}, "embedding": {"kind": "remote"}}, "kind one of"),
])
def test_a_spec_off_its_format_names_the_field(spec, message):
    with pytest.raises(SpecError, match=message):
        check_spec(spec)


def test_a_users_declared_spec_is_checked_when_the_trainer_reads_it():
    module = nn.Linear(2, 1)
    module.paramshard_spec = {"model": "mine", "args": {"f": lambda: 0}}
    with pytest.raises(ConfigError, match="Linear.paramshard_spec: .*not JSON serializable"):
        spec_of(module)
    module.paramshard_spec = {"model": "mine", "args": {"width": 2}}
    assert spec_of(module) == {"model": "mine", "args": {"width": 2}}
