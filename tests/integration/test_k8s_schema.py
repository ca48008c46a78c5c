"""`paramshard k8s` manifests against the strict Kubernetes schema (kubernetes_validate, a
Python process per flag set: moved from tests/unit)."""
from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from tests.unit.launch.engines.test_k8s_manifests import FLAG_SETS, k8s


@pytest.mark.parametrize("flags", FLAG_SETS.values(), ids=FLAG_SETS.keys())
def test_manifests_pass_the_strict_kubernetes_schema(capsys, tmp_path, flags):
    out = tmp_path / "job.yaml"
    code, stdout, err = k8s(capsys, "--out", str(out), *flags)   # after SCRIPT it would be a script argument
    assert code == 0, err
    assert stdout == "" and f"wrote {out}" in err
    r = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "-k", "1.32.0", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(out.read_text())]
    assert r.stdout.count("passed for resource") == len(kinds), r.stdout
