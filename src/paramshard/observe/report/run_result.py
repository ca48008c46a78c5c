"""A run's result in a few lines: what `paramshard report` prints first and the page shows
at its top. From the run directory alone (observe/run_records/records.py):

- a failed run (summary.json's exit code is not 0): the launcher's ``failure`` event, the
  summary it ended with (which rank failed first, its error, who failed after it);
- a finished run: the latest ``result`` a trainer logged (``trainer.log(result={...})``;
  the CTR app logs its best epoch with its validation and test metrics, apps/ctr/result.py);
- a run with no summary.json: still running, or its launcher was killed.
"""
from __future__ import annotations

from paramshard.observe.run_records.run_data import RunData

# A binary run's (a multi-task run's: the means over its labels, each label's AUC after them);
# a regression's RMSE, MSE and MAE.
METRICS = (("auc", "AUC"), ("logloss", "logloss"), ("accuracy", "accuracy"), ("rmse", "RMSE"), ("mse", "MSE"),
           ("mae", "MAE"))


def logged_result(run: RunData) -> dict | None:
    """The latest result any trainer logged (by record time), or None."""
    found = [r for records in run.trainers.values() for r in records if isinstance(r.get("result"), dict)]
    return max(found, key=lambda r: r["t"])["result"] if found else None


def failure_event(run: RunData) -> dict | None:
    """The launcher's last failure summary (a restarted job may have several: the last ended it)."""
    found = [e for e in run.events if e.get("event") == "failure" and isinstance(e.get("text"), str)]
    return found[-1] if found else None


def _scores(scores) -> str:
    if not isinstance(scores, dict):
        return ""
    parts = [f"{label} {scores[key]:.4f}" for key, label in METRICS
             if isinstance(scores.get(key), (int, float)) and not isinstance(scores.get(key), bool)]
    tasks = scores.get("tasks")
    if isinstance(tasks, dict):
        parts.append("(" + ", ".join(f"{name} AUC {t['auc']:.4f}" for name, t in tasks.items()
                                     if isinstance(t, dict) and isinstance(t.get("auc"), (int, float))) + ")")
    rows = scores.get("rows")
    if isinstance(rows, int) and not isinstance(rows, bool):
        parts.append(f"({rows:,} rows)")
    return " ".join(parts)


def _describe(result: dict) -> list[str]:
    """A best-epoch result as the CTR app logs it; any other as its keys and values."""
    if "best_epoch" in result:
        epochs = result.get("epochs")
        head = f"result: best epoch {result['best_epoch']}" + (f" of {epochs}" if isinstance(epochs, int) else "")
        if result.get("model"):
            head += f" ({result['model']})"
        lines = [head]
        if _scores(result.get("valid")):
            lines.append(f"  validation: {_scores(result['valid'])}")
        if _scores(result.get("test")):
            lines.append(f"  test:       {_scores(result['test'])}")
        warnings = result.get("warnings")
        for warning in warnings if isinstance(warnings, list) else []:
            lines.append(f"  warning: {warning}")
        return lines
    shown = ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in result.items())
    return [f"result: {shown}"]


def result_lines(run: RunData) -> list[str]:
    """The run's result, or its error, in a few lines (the first says which)."""
    summary = run.summary
    result = logged_result(run)
    if summary is None:
        lines = ["no summary.json: the run is still going, or its launcher was killed"]
        return lines + (_describe(result) if result else [])
    code = summary.get("exit_code")
    duration = summary.get("duration_s")
    took = f" after {duration:,.1f} s" if isinstance(duration, (int, float)) else ""
    if code != 0:
        failure = failure_event(run)
        lines = [f"failed: exit code {code}{took}"]
        if failure is not None:
            lines += [f"  {line}" for line in failure["text"].splitlines()]
        else:
            lines.append("  the launcher recorded no failure summary (stopped by a signal?): see logs/")
        return lines
    if result is None:
        return [f"finished: exit code 0{took}; the program logged no result (trainer.log(result={{...}}) "
                f"puts one here)"]
    return [f"finished: exit code 0{took}", *_describe(result)]
