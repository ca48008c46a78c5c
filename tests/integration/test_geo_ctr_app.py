"""The CTR app (`python -m paramshard.apps.ctr`) in geo mode, in one process (its standalone
server): it trains through epochs(), prefetching(), the epoch-end barrier, Trainer.pull(), the
chief's evaluation, broadcast and scale_learning_rate, with checkpoints; the model learns (AUC as
the multitask test's heads reach in sync mode) and each checkpoint holds the trainer's GEO state."""
import json
import logging
import os

import pytest

import paramshard as ps
from paramshard import log as ps_log
from paramshard.apps import ctr
from paramshard.checkpoint.format import checkpoints
from paramshard.data.features.infer import infer_schema
from paramshard.geo import trainer_state
from tests.integration.test_ctr_app_labels import table


@pytest.fixture
def geo_standalone(monkeypatch, tmp_path):
    for key in list(os.environ):
        if key.startswith(("PARAMSHARD_", "PADDLE_", "OMPI_")) or key == "TRAINING_ROLE":
            monkeypatch.delenv(key)
    monkeypatch.setenv("PARAMSHARD_MODE", "geo")
    monkeypatch.setenv("PARAMSHARD_GEO_K", "8")
    monkeypatch.setenv("PARAMSHARD_CHECKPOINT_DIR", str(tmp_path / "ckpt"))
    logger = logging.getLogger("paramshard")
    saved = (list(logger.handlers), logger.propagate, logger.level, ps_log._configured)
    env = ps.init()
    assert env.mode == "geo" and env.local_server is not None
    yield env
    env.local_server.close()
    logger.handlers[:], logger.propagate, ps_log._configured = saved[0], saved[1], saved[3]
    logger.setLevel(saved[2])


def test_the_ctr_app_trains_in_geo_mode(geo_standalone, tmp_path, capsys):
    table(tmp_path, "multitask")
    infer_schema(tmp_path / "train.csv", label="click").save(tmp_path / "schema.json")
    out = tmp_path / "out.json"
    assert ctr.main(["--train", str(tmp_path / "train.csv"), "--test", str(tmp_path / "test.csv"),
                     "--schema", str(tmp_path / "schema.json"), "--epochs", "3", "--batch-size", "64",
                     "--model", "widedeep", "--dim", "4", "--hidden", "16", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["mode"] == "geo" and result["warnings"] == []
    assert result["final"]["auc"] > 0.7, result["final"]
    saved = checkpoints(tmp_path / "ckpt")
    assert saved, "no checkpoint was written"
    for path in saved:          # every checkpoint has the trainer's optimizer state beside its position
        step = int(json.loads((path / "manifest.json").read_text())["step"])
        assert (tmp_path / "ckpt" / trainer_state.relpath(step, 0)).is_file(), path
