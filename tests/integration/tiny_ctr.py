"""A tiny CTR job for the serving tests: a CSV with a numeric, a categorical and a
multi-valued column, its fitted schema, and a DeepFM built by build_model trained a
few steps against a server in this process (server/core/in_process.py)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

import paramshard as ps
from paramshard.data import Column, Label, Schema, TabularReader, fit_schema
from paramshard.env import ClusterEnv
from paramshard.server.assembly import build_server
from paramshard.inference.evaluation import predict
from paramshard.models import build_model
from paramshard.trainer.trainer import Trainer

BATCH, ARGS, STEPS, SCORE_BATCH = 32, {"dim": 4, "hidden": [8, 4]}, 9, 16


def write_rows(path, rows: int, seed: int, label: bool = True) -> pd.DataFrame:
    """``rows`` rows (label "click" only with ``label``), as CSV or Parquet by the suffix;
    the same ``seed`` gives the same features with or without the label."""
    g = np.random.default_rng(seed)
    frame = pd.DataFrame({
        "price": np.round(g.lognormal(2, 1, rows), 2).astype(str),
        "city": g.choice(["paris", "rome", "oslo", "lima", "kyiv"], rows),
        "tags": ["|".join(g.choice(["a", "b", "c", "d"], g.integers(1, 4))) for _ in range(rows)]})
    frame.loc[g.random(rows) < 0.1, "price"] = ""           # missing values: the fitted mean
    clicks = (g.random(rows) < 0.3).astype(int)
    if label:
        frame.insert(0, "click", clicks)
    if str(path).endswith(".parquet"):
        frame.to_parquet(path, index=False)
    else:
        frame.to_csv(path, index=False)
    return frame


def fitted_schema(train) -> Schema:
    schema = Schema(Label("click"), [Column("price", transforms=["log", "standardize"], bucketize=4),
                                      Column("city", "categorical", min_count=2),
                                      Column("tags", "multi")])
    return fit_schema(schema, [train])


def in_process_env() -> tuple[ClusterEnv, object]:
    """A trainer's env and the in-process server it trains against (close it after)."""
    server = build_server(ClusterEnv(role=None, server_id=0), num_trainers=1, watch_peers=False,
                          in_process=True)
    env = ClusterEnv(role="trainer", servers=(server.address,), local_server=server,
                     num_trainers=1, trainer_id=0, timeout=10.0)
    return env, server


def train(env, schema: Schema, train_file, steps: int):
    """(model, trainer) after ``steps`` steps of a DeepFM on ``train_file``; the trainer is open."""
    torch.manual_seed(0)
    model = build_model("deepfm", schema, table_optimizer=ps.optim.Adagrad(lr=0.1), **ARGS)
    trainer = Trainer(model, ps.optim.Adam(lr=0.01), env=env)
    reader = TabularReader([train_file], schema, BATCH, shuffle=True)
    done = 0
    while done < steps:
        for batch in reader:
            b = batch.torch()
            logits = model(b["dense"], b["ids"], b["offsets"], b["weights"])
            trainer.step(F.binary_cross_entropy_with_logits(logits, b["labels"]))
            done += 1
            if done == steps:
                break
    return model, trainer


class Job:
    """A trained job's files under ``root``: train.csv, test.csv (labelled) and new.csv /
    new.parquet (the same rows without the label), the checkpoint ckpt/ at STEPS, and what
    the trained model gave for test.csv's rows through the server (eval mode, batches of
    SCORE_BATCH): ``expected``."""

    def __init__(self, root):
        self.root = root
        write_rows(root / "train.csv", 300, 0)
        self.test = write_rows(root / "test.csv", 70, 1)
        write_rows(root / "new.csv", 70, 1, label=False)
        write_rows(root / "new.parquet", 70, 1, label=False)
        self.schema = fitted_schema(root / "train.csv")
        env, server = in_process_env()
        try:
            model, trainer = train(env, self.schema, root / "train.csv", STEPS)
            trainer.pull()
            self.expected = predict(model, TabularReader([root / "test.csv"], self.schema, SCORE_BATCH))
            trainer.save(root / "ckpt")
            self.table_rows = {name: trainer.sparse.export_sparse(name) for name in trainer.tables}
            trainer.close()
        finally:
            server.close()
        self.ckpt = root / "ckpt"
