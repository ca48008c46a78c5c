"""Checkpoints against real processes (moved from tests/unit: each starts Python): a writer
killed mid-save, and `paramshard export-model` on a hostile checkpoint."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from paramshard.checkpoint.format import Checkpoint
from tests.unit.checkpoint.test_checkpoint_format import write
from tests.unit.checkpoint.test_checkpoint_hostile import VALUES, make, manifest_of, rewrite


@pytest.mark.processes        # kills the writer: `make test` only, not `make check`
def test_a_writer_killed_mid_save_leaves_the_previous_checkpoint_whole(tmp_path):
    write(tmp_path, 3, 3.0)
    # A second writer puts 1 GB in small pieces: it is killed while writing them.
    code = textwrap.dedent(f"""
        import numpy as np, sys
        from paramshard.checkpoint.format import CheckpointWriter
        w = CheckpointWriter({str(tmp_path)!r}, 4)
        print("writing", flush=True)
        for i in range(256):
            w.put(f"sparse/t0/part{{i}}.npy", np.ones(1 << 20, np.float32))
        w.commit({{"dense": [], "sparse": []}})
        print("committed", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    deadline = time.monotonic() + 30
    while not list(tmp_path.glob(".tmp-step-00000004-*/sparse/t0/part3.npy")):
        assert time.monotonic() < deadline and proc.poll() is None, "the writer finished before the kill"
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    assert list(tmp_path.glob(".tmp-step-00000004-*")), "the kill came too late to test anything"
    ckpt = Checkpoint(tmp_path)
    assert ckpt.step == 3
    np.testing.assert_array_equal(ckpt.array("dense/p0.values.npy"), np.full(1000, 3.0, np.float32))
    # The next save goes through (the stale temporary directory is ignored).
    write(tmp_path, 5, 5.0)
    assert Checkpoint(tmp_path).step == 5


def test_export_model_on_a_hostile_checkpoint_is_one_line_and_no_traceback(tmp_path):
    root = tmp_path / "ckpt"
    step = make(root)
    m = manifest_of(step)
    m["files"]["../../x.npy"] = m["files"].pop(VALUES)
    m["dense"][0]["files"]["values"] = "../../x.npy"
    rewrite(step, m)
    proc = subprocess.run([sys.executable, "-m", "paramshard", "export-model", str(root), "--out",
                           str(tmp_path / "m.pt")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("paramshard export-model: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "'../../x.npy' climbs out of the checkpoint" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "m.pt").exists()
