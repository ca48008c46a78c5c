"""The CTR app's result as the run directory keeps it: trainer 0 logs it once at the end
(``trainer.log(result=...)``, observe/run_records/trainer_records.py), the launcher writes it
to metrics.jsonl with the other records, and `paramshard report RUN_DIR` says it first."""
from __future__ import annotations

import math

# gauc: with --group-by only; rmse, mse, mae: a regression's (no AUC); a multi-task run's auc,
# logloss and accuracy are its labels' means, each label's under "tasks".
SHOWN = ("auc", "gauc", "logloss", "accuracy", "rmse", "mse", "mae", "rows")


def _metrics(scores: dict | None) -> dict | None:
    if not isinstance(scores, dict):
        return None
    out: dict = {}
    for name in SHOWN:
        value = scores.get(name)
        if isinstance(value, (int, float)):
            # JSON numbers (numpy's are not all JSON-able); NaN (one class only) as null.
            out[name] = int(value) if name == "rows" else (None if math.isnan(float(value)) else float(value))
    if isinstance(scores.get("tasks"), dict):
        out["tasks"] = {str(name): _metrics(task) for name, task in scores["tasks"].items()}
    return out


def result_record(out: dict) -> dict:
    """From the app's --json document (training.Run.finish): the best epoch, its validation
    scores and its model's test scores, what trained it, and the warnings."""
    best = out["best_epoch"]
    epoch: dict = next((e for e in out["epochs"] if e.get("epoch") == best), {})
    return {"app": "paramshard.apps.ctr", "model": out["model"], "best_epoch": best,
            "epochs": len(out["epochs"]), "valid": _metrics(epoch.get("valid")), "test": _metrics(out["final"]),
            "warnings": [str(w) for w in out.get("warnings", [])]}
