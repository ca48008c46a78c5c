"""The pure half of benchmarks/public_tables.py: reading a run's results, the verdicts the issue
asks for (the best paramshard model vs scikit-learn's logistic regression; each model vs its
plain PyTorch twin), medians over repetitions and the tables (tests/unit/benchmarks/test_benchmark_public_tables.py)."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

MODELS = ("lr", "widedeep", "deepfm", "dcn", "dcnv2", "xdeepfm", "autoint")
SKLEARN = ("LogisticRegression", "HistGradientBoosting")
LAUNCH = ("--servers", "2", "--trainers", "2", "--mode", "sync")
TWIN_TOLERANCE = 0.002           # |AUC(paramshard) - AUC(PyTorch twin)| the issue accepts


def ps_label(model: str) -> str:
    return f"paramshard {model}"


def twin_label(model: str) -> str:
    return f"PyTorch {model}"


def app_flags(help_text: str) -> dict:
    """Which model-selection flags the CTR app has (they came with issue 23)."""
    return {flag: f"--{flag}" in help_text.split() or f"--{flag} " in help_text
            for flag in ("valid", "patience")}


def metrics_of(result: dict) -> dict:
    """Test metrics of a run's --json: the run's model's - the refit's when it refit on a small
    table (apps/ctr/refit.py), else the best epoch's when it says, else the last epoch's."""
    chosen = result.get("final") if result.get("final_model") == "refit" else result.get("best") or result.get("final")
    if not chosen or "auc" not in chosen or "logloss" not in chosen:
        raise ValueError(f"no test metrics in the result (keys: {sorted(result)})")
    epochs = result.get("epochs") or []
    return {"auc": float(chosen["auc"]), "logloss": float(chosen["logloss"]),
            "epochs_run": len(epochs), "best_epoch": chosen.get("epoch", result.get("best_epoch"))}


def twin_settings(app_result: dict) -> dict:
    """What the app trained with, as its --json records it ("settings": the model's defaults it
    resolved, or the flags given), so the twin trains alike."""
    found = app_result.get("settings")
    if not isinstance(found, dict) or not {"lr", "table_lr", "batch_size"} <= set(found):
        raise ValueError(f"the app's --json records no settings (lr, table_lr, batch_size): {sorted(app_result)}")
    return {"lr": float(found["lr"]), "table_lr": float(found["table_lr"]), "batch_size": int(found["batch_size"]),
            "dim": found.get("dim"), "hidden": found.get("hidden"),
            # The selection the app settled on (its defaults scale with the table: apps/ctr/table_size.py).
            "patience": found.get("patience"), "lr_decay_after": found.get("lr_decay_after")}


def within(gap: float) -> bool:
    """|gap| <= the tolerance, up to float noise (0.902 - 0.900 is 0.0020000000000000018)."""
    return round(abs(gap), 9) <= TWIN_TOLERANCE


def summary(dataset: str, rows: dict) -> str:
    """One line: the best paramshard model vs scikit-learn's LR, and each model vs its PyTorch twin.
    ``rows``: label -> {"auc": ...} (labels as ps_label / twin_label / SKLEARN name)."""
    ours = {m: rows[ps_label(m)]["auc"] for m in MODELS if ps_label(m) in rows}
    if not ours or "LogisticRegression" not in rows:
        return f"{dataset}: incomplete (no paramshard result or no LogisticRegression)"
    best = max(ours, key=ours.get)
    lr = rows["LogisticRegression"]["auc"]
    beats = ours[best] > lr
    parts = [f"{dataset}: best paramshard model {best} AUC {ours[best]:.4f} vs LogisticRegression {lr:.4f}: "
             f"{'beats it' if beats else 'does NOT beat it'} ({ours[best] - lr:+.4f})"]
    twins = []
    for m in ours:
        if twin_label(m) in rows:
            gap = ours[m] - rows[twin_label(m)]["auc"]
            twins.append(f"{m} {gap:+.4f} {'ok' if within(gap) else 'OVER'}")
    parts.append("vs the PyTorch twin (|dAUC| <= 0.002): " + (", ".join(twins) if twins else "none run"))
    return "; ".join(parts)


def verdicts(dataset: str, rows: dict) -> tuple[bool, list[str]]:
    """(best paramshard beats LR, the models whose twin gap is over the tolerance)."""
    ours = {m: rows[ps_label(m)]["auc"] for m in MODELS if ps_label(m) in rows}
    beats = bool(ours) and "LogisticRegression" in rows and max(ours.values()) > rows["LogisticRegression"]["auc"]
    over = [m for m in ours if twin_label(m) in rows and not within(ours[m] - rows[twin_label(m)]["auc"])]
    return beats, over


def medians(runs: list[dict]) -> dict:
    """label -> the median of each number over the repetitions."""
    out = {}
    for label in runs[0]:
        keys = [k for k, v in runs[0][label].items() if isinstance(v, (int, float)) and v is not None]
        out[label] = {k: C.median([r[label][k] for r in runs if label in r]) for k in keys}
        out[label].update({k: v for k, v in runs[-1][label].items() if k not in keys})
    return out


def table_rows(rows: dict) -> list[list[str]]:
    out = []
    order = [f(m) for m in MODELS for f in (ps_label, twin_label)] + list(SKLEARN)
    for label in order:
        if label not in rows:
            continue
        r = rows[label]
        epochs = "" if "epochs_run" not in r else (f"{r['epochs_run']:.0f}" + (
            f" (best {r['best_epoch']:.0f})" if r.get("best_epoch") is not None else ""))
        shown = label + (" (did not converge)" if r.get("converged") is False else "")
        out.append([shown, f"{r['auc']:.4f}", f"{r['logloss']:.4f}", f"{r['wall_s']:.1f}", epochs])
    return out


def report(args, results: dict, descriptions: dict, defaults: dict, flags: dict, note: str) -> None:
    headers = ["model", "test AUC", "log loss", "wall s", "epochs"]
    right = [False, True, True, True, True]
    tables, lines = [], []
    for name, rows in results.items():
        tables.append((f"{name} (median of {args.repeats})", headers, table_rows(rows), right))
        lines.append(summary(name, rows))
    selection = ("early stopping on a 10% validation hold-out, best epoch tested" if flags["valid"]
                 else "no validation flags in the app yet: every epoch run, the last one tested")
    setup = (f"paramshard: launch {' '.join(LAUNCH)}, apps.ctr with each model's defaults (models/defaults.py: batch "
             f"256 per trainer; dim 16, hidden 400,400 for the deep models), at most {args.epochs or defaults['epochs']} "
             f"epochs; {selection}. PyTorch: benchmarks/plain_torch_ctr.py, one process, 1 torch thread, the "
             f"settings the app recorded, steps of both trainers' batches of the sync job together, the app's "
             f"selection rule. scikit-learn fits on the whole training file. Wall time: whole process (start-up, "
             f"reading, training, evaluation)")
    if args.markdown:
        for (title, h, rows, r), desc, line in zip(tables, descriptions.values(), lines):
            print(f"**{title}**: {desc}\n")
            print(C.markdown_table(h, rows, r))
            print(f"\n{line}\n")
        print(f"_{setup}_\n\n_{note}_\n")
        return
    C.emit(False, tables, [*descriptions.values(), *lines, setup, note])
