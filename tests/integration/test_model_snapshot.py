"""snapshot_model: the model file of a live job. Oracle: export_model of a checkpoint the
same trainer saved at the same step (the same tensors, the same recorded model), and the
module built from the snapshot alone predicts what the trained model gave through the server."""
import numpy as np
import torch

from paramshard import runtime
from paramshard.data import TabularReader
from paramshard.evaluation import predict
from paramshard.model_snapshot import snapshot_model
from paramshard.serving import build_from_file, export_model, read_model
from tests.integration.tiny_ctr import ARGS, in_process_env, fitted_schema, train, write_rows


def same_file(a: dict, b: dict) -> None:
    assert {k: v for k, v in a.items() if k not in ("dense", "sparse", "checkpoint")} == \
        {k: v for k, v in b.items() if k not in ("dense", "sparse", "checkpoint")}
    assert a["dense"].keys() == b["dense"].keys() and a["sparse"].keys() == b["sparse"].keys()
    for name in a["dense"]:
        assert torch.equal(a["dense"][name], b["dense"][name]), name
    for name, table in a["sparse"].items():
        for key, value in table.items():
            other = b["sparse"][name][key]
            assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other, (name, key)


def test_a_snapshot_is_the_export_of_a_checkpoint_at_the_same_step(tmp_path):
    write_rows(tmp_path / "train.csv", 200, 0)
    write_rows(tmp_path / "test.csv", 40, 1)
    schema = fitted_schema(tmp_path / "train.csv")
    saved = runtime._local_server
    env, server = in_process_env()
    try:
        model, trainer = train(env, schema, tmp_path / "train.csv", 7)
        trainer.pull()
        snap = snapshot_model(trainer, tmp_path / "snap.pt")
        expected = predict(model, TabularReader([tmp_path / "test.csv"], schema, 64))
        trainer.save(tmp_path / "ckpt")
        first = {n: t.clone() for n, t in snap["dense"].items()}
        b = next(iter(TabularReader([tmp_path / "train.csv"], schema, 8))).torch()
        trainer.step(model(b["dense"], b["ids"], b["offsets"], b["weights"]).sum())      # training goes on
        trainer.close()
    finally:
        server.close()
        runtime._local_server = saved
    exported = export_model(tmp_path / "ckpt", tmp_path / "exported.pt")
    assert snap["step"] == exported["step"] == 7 and snap["checkpoint"] is None
    assert snap["spec"] == {"model": "deepfm", "args": {**ARGS, "prefix": ""}, "schema": schema.to_dict()}
    same_file(snap, exported)
    same_file(snap, torch.load(tmp_path / "snap.pt", weights_only=True))
    assert len(snap["sparse"]["deep"]["ids"]) > 0
    # The returned tensors are copies: training on did not change them.
    assert all(torch.equal(first[n], snap["dense"][n]) for n in first)
    assert read_model(tmp_path / "snap.pt").spec == snap["spec"]
    rebuilt = build_from_file(tmp_path / "snap.pt")
    np.testing.assert_array_equal(predict(rebuilt, TabularReader([tmp_path / "test.csv"], schema, 64)), expected)
