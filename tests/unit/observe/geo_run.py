"""A GEO job's run directory written by hand, as the launcher writes it (geo/records.py,
observe/run_records/records.py): two trainers' rounds, progress records, validation AUC."""
from __future__ import annotations

import json

from paramshard.observe.run_records.run_data import load_run

T0 = 1_790_000_000.0
KS = {0: [4, 8, 16, 16, 32], 1: [4, 8, 8, 16, 16]}        # each trainer's rounds' k


def geo_run(root, *, auc=True, blocked_s=None):
    """``blocked_s``: every round's (overlapped sends: what the send took from training)."""
    root.mkdir(parents=True, exist_ok=True)
    records = []
    for trainer, ks in KS.items():
        step = 0
        for i, k in enumerate(ks):
            step += k
            records.append({"t": T0 + 10 * (i + 1) + trainer, "kind": "geo_round", "trainer": trainer, "step": step,
                            "k": k, "next_k": ks[i + 1] if i + 1 < len(ks) else 64, "bytes": 1000 * k + trainer,
                            "wire_s": 0.1, "compute_s": 0.01 * k, "staleness": k, "delta_norm": 1.0,
                            "value_norm": 10.0, "drift_norm": 0.1,
                            **({} if blocked_s is None else {"blocked_s": blocked_s})})
        logged = [{"t": T0 + 25, "step": 12, "epoch": 0, "values": {"valid_auc": 0.70, "test_auc": 0.69}},
                  {"t": T0 + 45, "step": 44, "epoch": 1, "values": {"valid_auc": 0.74, "test_auc": 0.73}}] \
            if auc and trainer == 0 else []
        records += [{"t": T0 + 30 + trainer, "kind": "trainer", "trainer": trainer, "step": 28, "samples": 28 * 100,
                     "loss": 0.6, "logged": logged[:1]},
                    {"t": T0 + 50 + trainer, "kind": "trainer", "trainer": trainer, "step": sum(KS[trainer]),
                     "samples": sum(KS[trainer]) * 100, "loss": 0.5, "logged": logged[1:]}]
    records.sort(key=lambda r: r["t"])
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return load_run(root)
