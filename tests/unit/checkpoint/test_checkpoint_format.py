"""The checkpoint files: atomic commit, latest, keep, verification, and a writer killed mid-save."""
import json
import os
import subprocess

import numpy as np
import pytest

from paramshard.checkpoint.format import Checkpoint, CheckpointError, CheckpointWriter, checkpoints, resolve


def write(root, step, value, keep=None):
    w = CheckpointWriter(root, step)
    w.put("dense/p0.values.npy", np.full(1000, value, np.float32))
    return w.commit({"dense": [], "sparse": []}, keep=keep)


def test_commit_publishes_whole_checkpoints_and_latest(tmp_path):
    write(tmp_path, 5, 1.0)
    write(tmp_path, 9, 2.0)
    ckpt = Checkpoint(tmp_path)
    assert ckpt.step == 9 and ckpt.path.name == "step-00000009"
    np.testing.assert_array_equal(ckpt.array("dense/p0.values.npy"), np.full(1000, 2.0, np.float32))
    assert Checkpoint(tmp_path / "step-00000005").step == 5
    assert not list(tmp_path.glob(".tmp-*"))


def test_keep_prunes_the_oldest(tmp_path):
    for step in range(1, 6):
        write(tmp_path, step, float(step), keep=2)
    assert [p.name for p in checkpoints(tmp_path)] == ["step-00000004", "step-00000005"]


def test_unknown_and_mismatched_files_are_named(tmp_path):
    path = write(tmp_path, 1, 1.0)
    ckpt = Checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="lists no file dense/nope.npy"):
        ckpt.array("dense/nope.npy")
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["dense/p0.values.npy"]["shape"] = [999]
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"float32\[1000\], the manifest says <f4\[999\]"):
        Checkpoint(tmp_path).array("dense/p0.values.npy")
    (path / "dense/p0.values.npy").unlink()
    with pytest.raises(CheckpointError, match="cannot read"):
        Checkpoint(tmp_path).array("dense/p0.values.npy")


def test_nothing_to_resume_says_so(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        resolve(tmp_path / "missing")
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        resolve(tmp_path)
    (tmp_path / "latest").write_text(json.dumps({"checkpoint": "step-00000007"}))
    with pytest.raises(CheckpointError, match="names step-00000007, which is missing or incomplete"):
        resolve(tmp_path)


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB file system (tmpfs, unmounted after); skipped where mounting is not allowed."""
    import shutil
    folder = tmp_path / "disk"
    folder.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(folder)], capture_output=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_full_disk_names_the_file_and_the_bytes_it_needed(small_disk):
    writer = CheckpointWriter(small_disk, 7)
    writer.put("dense/p0.values.npy", np.zeros(1000, np.float32))
    big = np.zeros(2_000_000, np.uint8)
    with pytest.raises(CheckpointError) as err:
        writer.put("dense/p1.values.npy", big)
    message = str(err.value)
    assert f"no space left writing {writer.tmp / 'dense/p1.values.npy'}: it needs about 2,000,128 bytes" in message
    assert "bytes free there; this checkpoint had 4,128 bytes written before it" in message
    assert "give a --checkpoint-dir with room (the previous checkpoint is kept whole)" in message
    # The disk is full now: the manifest cannot be written either, and says so by its name.
    with pytest.raises(CheckpointError, match=rf"no space left writing {writer.tmp / 'manifest.json'}: it needs"):
        writer.commit({})
    assert not [p for p in writer.tmp.iterdir() if p.name.endswith(".tmp")]    # no half manifest left
    writer.abort()
    assert checkpoints(small_disk) == [] and list(small_disk.iterdir()) == []
