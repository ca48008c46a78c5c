"""serving.snapshot_model: the model file of a live job. Oracle: export_model of a checkpoint the
same trainer saved at the same step (the same tensors, the same recorded model), and the
module built from the snapshot alone predicts what the trained model gave through the server."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from paramshard.data import TabularReader
from paramshard.inference.evaluation import predict
from paramshard.inference.serving import build_from_file, export_model, read_model, snapshot_model
from tests.integration.tiny_ctr import ARGS, in_process_env, fitted_schema, train, write_rows
import pytest

# Starts, stops or kills server processes of its own: `make test` only, not `make check`.
pytestmark = pytest.mark.processes


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


# Collective mode has no servers: hashed tables are module parameters, so the snapshot's
# dense part holds them, and the module built from the file alone predicts what the
# trained one does. One trainer in its own process (the gloo group is process-wide).
COLLECTIVE = """\
import sys
import numpy as np
import torch
import torch.nn.functional as F
import paramshard as ps
from paramshard.data import TabularReader
from paramshard.inference.evaluation import predict
from paramshard.inference.serving import snapshot_model
from paramshard.models import build_model, hashed_embedding
from paramshard.inference.serving import build_from_file, read_model
from tests.integration.tiny_ctr import ARGS, fitted_schema, write_rows

d = sys.argv[1]
ps.init()
write_rows(f"{d}/train.csv", 100, 0)
schema = fitted_schema(f"{d}/train.csv")
torch.manual_seed(0)
model = build_model("deepfm", schema, embedding=hashed_embedding(64), **ARGS)
trainer = ps.Trainer(model, ps.optim.Adam(lr=0.05))
for batch in TabularReader([f"{d}/train.csv"], schema, 32, drop_last=True):
    b = batch.torch()
    trainer.step(F.binary_cross_entropy_with_logits(model(b["dense"], b["ids"], b["offsets"], b["weights"]), b["labels"]))
trainer.pull()
snap = snapshot_model(trainer, f"{d}/snap.pt")
assert snap["sparse"] == {} and "deep.weight" in snap["dense"], sorted(snap["dense"])
for name, p in model.named_parameters():
    assert torch.equal(snap["dense"][name], p.detach()), name
expected = predict(model, TabularReader([f"{d}/train.csv"], schema, 64))
trainer.close()
np.testing.assert_array_equal(predict(build_from_file(f"{d}/snap.pt"), TabularReader([f"{d}/train.csv"], schema, 64)), expected)
print("snapshot ok", trainer.step_count, read_model(f"{d}/snap.pt").spec["embedding"])
"""


def test_a_collective_snapshot_holds_the_hashed_tables_and_builds_the_model_again(tmp_path):
    from paramshard.launch.engines.ports import free_ports
    (tmp_path / "snap.py").write_text(COLLECTIVE)
    root = Path(__file__).resolve().parents[2]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PARAMSHARD_")}
    environ.update(PARAMSHARD_ROLE="trainer", PARAMSHARD_MODE="collective", PARAMSHARD_TRAINERS="1",
                   PARAMSHARD_TRAINER_ID="0", PARAMSHARD_COLLECTIVE_ADDR=f"127.0.0.1:{free_ports(1)[0]}",
                   PARAMSHARD_TIMEOUT="30", PYTHONPATH=os.pathsep.join([str(root / "src"), str(root)]))
    done = subprocess.run([sys.executable, str(tmp_path / "snap.py"), str(tmp_path)], env=environ,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "snapshot ok 3 {'kind': 'hashed', 'buckets': 64" in done.stdout, \
        done.stdout + done.stderr
