"""What must not change with Python's per-process str hash (PYTHONHASHSEED): feature ids and
sharding plans, computed in processes with other seeds (moved from tests/unit: each starts
Python and imports paramshard)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import paramshard
from paramshard.data.features.hashing import feature_ids
from paramshard.env import DISPATCHERS
from paramshard.placement.sharding import ParamSpec, make_plan

# The children import this checkout's paramshard, as the test process does (not an installed one).
SOURCES = str(Path(paramshard.__file__).resolve().parents[1])


def test_feature_ids_are_the_same_in_processes_with_other_hash_seeds():
    here = feature_ids("city", np.array(["Paris", "Oslo", "Paris", ""], dtype=object)).tolist()
    code = ("import numpy as np; from paramshard.data.features.hashing import feature_ids; "
            "print(feature_ids('city', np.array(['Paris','Oslo','Paris',''], dtype=object)).tolist())")
    for seed in ("0", "12345"):     # Python's own str hash changes with PYTHONHASHSEED; ours must not
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin", "PYTHONPATH": SOURCES}).stdout
        assert json.loads(out) == here


# The same plan in every process, whatever PYTHONHASHSEED says.
STABILITY_SCRIPT = """
import json
from paramshard.placement.sharding import ParamSpec, make_plan
params = [ParamSpec(f"p{i}.w", (1000 + 37 * i, 3 + i)) for i in range(12)] + [ParamSpec("bias", (4097,))]
out = {d: [make_plan(params, 5, d, 1000).to_json(), make_plan(params, 5, d, 1000).fingerprint()]
       for d in ("round_robin", "hash", "legacy_v1", "balanced")}
print(json.dumps({"plans": out, "salted": hash("p0.w.block0")}))
"""


def test_plans_are_equal_across_processes_with_different_hash_seeds():
    params = [ParamSpec(f"p{i}.w", (1000 + 37 * i, 3 + i)) for i in range(12)] + [ParamSpec("bias", (4097,))]
    local = {d: [make_plan(params, 5, d, 1000).to_json(), make_plan(params, 5, d, 1000).fingerprint()]
             for d in DISPATCHERS}
    salted = set()
    for seed in ("1", "987654"):
        proc = subprocess.run([sys.executable, "-c", STABILITY_SCRIPT], capture_output=True, text=True,
                              env={**os.environ, "PYTHONHASHSEED": seed}, timeout=60, check=True)
        child = json.loads(proc.stdout)
        assert json.loads(json.dumps(local)) == child["plans"]
        salted.add(child["salted"])
    assert len(salted) == 2  # the test has teeth: Python's hash() did differ between the children
