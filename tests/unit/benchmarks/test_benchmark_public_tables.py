"""The pure parts of benchmarks/public_tables.py (in public_tables_report.py: reading results, the
verdicts, the tables) and of its PyTorch twin (plain_torch_ctr.py: the local tables, the early-stopping rule)."""
from __future__ import annotations

import argparse
import zlib

import numpy as np
import pytest
import torch

from paramshard.placement.sparse_hash import initial_rows

from tests.unit.benchmark_scripts import import_script

bench = import_script("public_tables_report")
import_script("public_tables")          # the script itself imports (its names resolve)
twin = import_script("plain_torch_ctr")

BEFORE = "usage: python -m paramshard.apps.ctr [-h] --train PATH ...\n  --epochs EPOCHS  (default: 3)\n"
AFTER = BEFORE + "  --valid PATH [PATH ...]\n  --valid-fraction F\n  --patience N    epochs without ... (default: 2)\n"


def test_the_model_selection_flags_are_seen_only_when_the_app_has_them():
    assert bench.app_flags(BEFORE) == {"valid": False, "patience": False}
    assert bench.app_flags(AFTER) == {"valid": True, "patience": True}
    assert bench.app_flags("  --valid-fraction F\n") == {"valid": False, "patience": False}   # not --valid itself


def test_metrics_are_the_best_epochs_when_the_result_has_them_else_the_last():
    epochs = [{"epoch": 1, "auc": 0.8}, {"epoch": 2, "auc": 0.7}]
    final = {"auc": 0.7, "logloss": 0.5}
    assert bench.metrics_of({"epochs": epochs, "final": final}) == {
        "auc": 0.7, "logloss": 0.5, "epochs_run": 2, "best_epoch": None}
    best = {"auc": 0.8, "logloss": 0.4, "epoch": 1}
    assert bench.metrics_of({"epochs": epochs, "final": final, "best": best}) == {
        "auc": 0.8, "logloss": 0.4, "epochs_run": 2, "best_epoch": 1}
    with pytest.raises(ValueError, match="no test metrics"):
        bench.metrics_of({"epochs": epochs})


def test_the_twin_trains_with_the_settings_the_app_recorded():
    recorded = {"settings": {"lr": 0.03, "table_lr": 0.2, "batch_size": 256, "embedding_l2": 0.0}}
    assert bench.twin_settings(recorded) == {"lr": 0.03, "table_lr": 0.2, "batch_size": 256, "dim": None,
                                             "hidden": None, "patience": None, "lr_decay_after": None}
    deep = {"settings": {"lr": 3e-3, "table_lr": 0.05, "batch_size": 256, "dim": 16, "hidden": [400, 400],
                         "patience": 4, "lr_decay_after": 2}}
    assert bench.twin_settings(deep)["hidden"] == [400, 400]
    # The selection the app settled on for the table (issue 32): the twin stops and decays alike.
    assert (bench.twin_settings(deep)["patience"], bench.twin_settings(deep)["lr_decay_after"]) == (4, 2)
    with pytest.raises(ValueError, match="no settings"):
        bench.twin_settings({"final": {}})


def rows(ps: dict, pt: dict, lr: float) -> dict:
    out = {bench.ps_label(m): {"auc": a} for m, a in ps.items()}
    out.update({bench.twin_label(m): {"auc": a} for m, a in pt.items()})
    out["LogisticRegression"] = {"auc": lr}
    return out


def test_the_summary_compares_the_best_model_with_lr_and_each_model_with_its_twin():
    r = rows({"lr": 0.90, "deepfm": 0.915}, {"lr": 0.9015, "deepfm": 0.9100}, lr=0.91)
    line = bench.summary("adult", r)
    assert "best paramshard model deepfm AUC 0.9150 vs LogisticRegression 0.9100: beats it (+0.0050)" in line
    assert "lr -0.0015 ok" in line and "deepfm +0.0050 OVER" in line
    assert bench.verdicts("adult", r) == (True, ["deepfm"])


def test_not_beating_lr_and_the_tolerance_edge():
    r = rows({"lr": 0.90, "dcn": 0.905}, {"lr": 0.902, "dcn": 0.9071}, lr=0.905)
    assert "does NOT beat it (+0.0000)" in bench.summary("bio", r)      # equal is not better
    assert bench.verdicts("bio", r) == (False, ["dcn"])                # 0.002 exactly is within
    assert "incomplete" in bench.summary("x", {"LogisticRegression": {"auc": 0.5}})


def test_medians_over_repetitions_and_the_table_order():
    runs = [{"paramshard lr": {"auc": a, "wall_s": w, "best_epoch": None}}
            for a, w in ((0.8, 30), (0.9, 10), (0.7, 20))]
    assert bench.medians(runs) == {"paramshard lr": {"auc": 0.8, "wall_s": 20, "best_epoch": None}}
    table = bench.table_rows({"HistGradientBoosting": {"auc": 0.9, "logloss": 0.3, "wall_s": 1.0},
                              "PyTorch lr": {"auc": 0.8, "logloss": 0.4, "wall_s": 2.0, "epochs_run": 3,
                                             "best_epoch": 2},
                              "LogisticRegression": {"auc": 0.8, "logloss": 0.4, "wall_s": 1.0, "converged": False},
                              "paramshard lr": {"auc": 0.81, "logloss": 0.4, "wall_s": 3.0, "epochs_run": 3,
                                                "best_epoch": None}})
    assert [r[0] for r in table] == ["paramshard lr", "PyTorch lr", "LogisticRegression (did not converge)",
                                     "HistGradientBoosting"]
    assert table[1][1:] == ["0.8000", "0.4000", "2.0", "3 (best 2)"]


def test_twin_tables_start_as_paramshards_and_read_zeros_for_ids_training_never_held():
    vocab = np.array([-5, 3, 1 << 40], np.int64)
    table = twin.local_tables(vocab)("deep", 4)
    seed = zlib.crc32(b"deep") & 0x7FFFFFFF
    want = initial_rows(seed, vocab.view(np.uint64), 4, 0.01)
    ids = torch.tensor([[3], [1 << 40], [7], [-5]])
    got = table(ids).detach().numpy()
    np.testing.assert_array_equal(got[[0, 1, 3]], want[[1, 2, 0]])
    np.testing.assert_array_equal(got[2], np.zeros(4, np.float32))


def test_the_twin_stops_and_decays_by_the_apps_own_rule():
    rule = twin.selection(argparse.Namespace(patience=2, lr_decay=0.1, lr_decay_after=1))
    assert rule.decide([0.5]).improved and rule.decide([0.5, 0.51]).improved
    assert rule.decide([0.5, 0.5]).decay and rule.decide([0.5, 0.5, 0.49]).stop
    small = twin.selection(argparse.Namespace(patience=4, lr_decay=0.1, lr_decay_after=2))    # a small table's
    assert not small.decide([0.5, 0.5]).decay and small.decide([0.5, 0.5, 0.49]).decay


def test_the_report_prints_a_table_and_a_verdict_per_dataset(capsys):
    import argparse
    rows = {bench.ps_label("deepfm"): {"auc": 0.91, "logloss": 0.3, "wall_s": 40.0, "epochs_run": 3,
                                       "best_epoch": None},
            bench.twin_label("deepfm"): {"auc": 0.909, "logloss": 0.3, "wall_s": 20.0, "epochs_run": 3,
                                         "best_epoch": None},
            "LogisticRegression": {"auc": 0.90, "logloss": 0.32, "wall_s": 5.0, "converged": True},
            "HistGradientBoosting": {"auc": 0.92, "logloss": 0.28, "wall_s": 9.0}}
    args = argparse.Namespace(repeats=1, epochs=None, markdown=True)
    defaults = {"batch_size": 256, "dim": 8, "hidden": "128,64", "epochs": 3}
    bench.report(args, {"adult": rows}, {"adult": "adult: described"}, defaults, {"valid": False}, "machine")
    out = capsys.readouterr().out
    assert "**adult (median of 1)**: adult: described" in out
    assert "| paramshard deepfm | 0.9100 | 0.3000 | 40.0 | 3 |" in out
    assert "beats it (+0.0100)" in out and "deepfm +0.0010 ok" in out


def test_metrics_are_the_refits_when_the_app_refit():
    """Issue 32: on a small table the app's model is a refit on all of --train ("final"), not the
    best epoch's ("best", trained without the hold-out)."""
    result = {"epochs": [{"auc": 0.7}, {"auc": 0.8}], "best_epoch": 2, "best": {"auc": 0.8, "logloss": 0.4},
              "final": {"auc": 0.82, "logloss": 0.39}, "final_model": "refit"}
    assert bench.metrics_of(result) == {"auc": 0.82, "logloss": 0.39, "epochs_run": 2, "best_epoch": 2}
