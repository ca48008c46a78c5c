"""The examples, run as a user runs them (smaller data, same code paths)."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def launch(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "paramshard", "launch", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def test_ctr_demo_learns_well_above_a_constant_predictor(tmp_path):
    r = launch("--servers", "2", "--trainers", "2", str(ROOT / "examples/ctr_wide_deep.py"),
               "--train-rows", "60000", "--test-rows", "10000", "--workdir", str(tmp_path))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    aucs = [float(a) for a in re.findall(r"test AUC (\d\.\d+)", r.stdout)]
    assert len(aucs) == 2, r.stdout          # before training and after the epoch
    assert aucs[0] < 0.6 and aucs[-1] > 0.68, aucs   # a constant predictor has AUC 0.5
    assert "samples/s" in r.stdout and "sparse rows" in r.stdout


def test_word2vec_runs_and_prints_neighbours():
    r = launch("--servers", "2", "--trainers", "2", str(ROOT / "examples/word2vec.py"),
               "--epochs", "1", "--max-steps", "30")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "nearest neighbours" in r.stdout
    assert re.search(r"money: \w+", r.stdout)


def test_digits_demo_reaches_high_accuracy():
    r = launch("--servers", "2", "--trainers", "2", "--dispatch", "balanced",
               str(ROOT / "examples/digits_mlp.py"), "--epochs", "4")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    acc = [float(a) for a in re.findall(r"test accuracy (\d\.\d+)", r.stdout)]
    assert acc and acc[-1] > 0.9, acc


def test_ctr_example_on_prepared_shards(tmp_path):
    """The real-data path: gen-data -> split-data -> each trainer reads its own part."""
    def cli(*args):
        r = subprocess.run([sys.executable, "-m", "paramshard", *args], capture_output=True, text=True,
                           timeout=120, cwd=ROOT)
        assert r.returncode == 0, r.stderr
        return r

    cli("gen-data", str(tmp_path / "all.tsv"), "--rows", "40000", "--seed", "1")   # one hidden model
    lines = (tmp_path / "all.tsv").read_text().splitlines(keepends=True)
    (tmp_path / "train.tsv").write_text("".join(lines[:35000]) + "1\tnot-a-number\n")   # + a broken line
    (tmp_path / "test.tsv").write_text("".join(lines[35000:]))
    cli("split-data", str(tmp_path / "train.tsv"), "--shards", "2", "--out", str(tmp_path / "shards"))
    r = launch("--servers", "1", "--trainers", "2", str(ROOT / "examples/ctr_wide_deep.py"),
               "--data", str(tmp_path / "shards"), "--test", str(tmp_path / "test.tsv"),
               "--train-rows", "35000")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "trainer 0 reads ['part-00000']" in r.stdout
    aucs = [float(a) for a in re.findall(r"test AUC (\d\.\d+)", r.stdout)]
    assert aucs[-1] > aucs[0] + 0.05, aucs
    assert "skipped 1 malformed lines" in r.stdout
