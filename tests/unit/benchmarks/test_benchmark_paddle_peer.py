"""benchmarks/ps_vs_pytorch.py's PaddlePaddle candidates without Paddle: the skip and its reason, the
ratio table, and the dense initial weights handed to the Paddle worker (no processes started)."""
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tests.unit.benchmark_scripts import import_script

B = import_script("ps_vs_pytorch")
P = import_script("paddle_peer")


def jobs():
    return [(d, c) for c in B.CANDIDATES for d in ("uniform", "zipf")]


def test_without_the_paddle_venv_the_candidates_are_skipped_and_the_reason_names_the_install_script(
        monkeypatch, tmp_path):
    monkeypatch.setattr(P, "ROOT", tmp_path)
    ok, why = P.available()
    assert not ok and "scripts/install-paddle-peer.sh" in why
    monkeypatch.setattr(B.paddle_peer, "ROOT", tmp_path)
    said = []
    args = SimpleNamespace(paddle="auto", seed=0)
    kept = B.paddle_jobs(jobs(), args, tmp_path, said.append)
    assert [c.engine for _, c in kept if c.engine == "paddle"] == []
    assert len(kept) == len(jobs()) - 4                     # 2 Paddle candidates x 2 distributions
    assert said == [args.paddle_skipped] and "install-paddle-peer.sh" in said[0]


def test_paddle_off_skips_them_without_looking_for_paddle(monkeypatch, tmp_path):
    monkeypatch.setattr(B.paddle_peer, "available", lambda: pytest.fail("--paddle off must not look"))
    args = SimpleNamespace(paddle="off", seed=0)
    kept = B.paddle_jobs(jobs(), args, tmp_path, lambda msg: None)
    assert all(c.engine != "paddle" for _, c in kept) and args.paddle_skipped.endswith("--paddle off")


def test_the_paddle_ratio_is_paramshards_median_over_paddles_median_per_shape():
    runs = {("uniform", "2s+2w async"): [{"samples_per_s": r} for r in (40_000, 44_000, 42_000)],
            ("uniform", "PaddlePaddle PS 2s+2w async"): [{"samples_per_s": r} for r in (20_000, 21_000, 19_000)],
            ("uniform", "1s+1w async"): [{"samples_per_s": 30_000}]}          # no Paddle 1s+1w: no row
    assert B.paddle_table(runs, ["uniform", "zipf"]) == [
        ["uniform", "paramshard 2s+2w async / PaddlePaddle PS 2s+2w async", "42,000", "20,000", "2.10x"]]


def test_a_candidate_without_test_metrics_shows_na_not_an_invented_auc():
    pt = [{"samples_per_s": 10_000.0, "auc": 0.7, "logloss": 0.6}]
    runs = {("uniform", B.PT.name): pt,
            ("uniform", "PaddlePaddle PS 1s+1w async"): [{"samples_per_s": 5_000.0, "auc": None, "logloss": None}]}
    rows = B.main_table(runs, ["uniform"])
    assert rows[1] == ["uniform", "PaddlePaddle PS 1s+1w async", "5,000", "5,000-5,000", "0.50x", "n/a", "n/a", "n/a"]


def test_the_paddle_worker_gets_pytorchs_initial_mlp_transposed_to_in_by_out(tmp_path):
    mlp = B.build_model("torch", 3).mlp
    out = P.write_dense_init(mlp, tmp_path / "init")
    linears = [m for m in mlp if hasattr(m, "weight")]
    assert sorted(p.name for p in Path(out).iterdir()) == ["b0.npy", "b1.npy", "b2.npy", "w0.npy", "w1.npy", "w2.npy"]
    for i, lin in enumerate(linears):
        assert np.array_equal(np.load(out / f"w{i}.npy"), lin.weight.detach().numpy().T)
        assert np.array_equal(np.load(out / f"b{i}.npy"), lin.bias.detach().numpy())
    assert np.load(out / "w0.npy").shape == (B.DENSE + B.FIELDS * B.DIM, 400)
