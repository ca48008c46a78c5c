"""The examples, run as a user runs them (smaller data, same code paths). The digits demo's
test is test_run_example.py's job under `paramshard launch`."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
METRIC = re.compile(r"test AUC (\d\.\d+)\s+logloss (\d\.\d+)")


def launch(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "paramshard", "launch", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module")
def ctr_demo(tmp_path_factory):
    """The CTR demo trained once with a checkpoint directory: (result, directory, data flags)."""
    d = tmp_path_factory.mktemp("ctr-demo")
    data = ["--train-rows", "60000", "--test-rows", "10000", "--workdir", str(d / "work")]
    r = launch("--servers", "2", "--trainers", "2", "--checkpoint-dir", str(d / "ckpt"),
               str(ROOT / "examples/ctr_wide_deep.py"), *data)
    return r, d, data


def test_ctr_demo_learns_well_above_a_constant_predictor(ctr_demo):
    r, _, _ = ctr_demo
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    aucs = [float(a) for a in re.findall(r"test AUC (\d\.\d+)", r.stdout)]
    assert len(aucs) == 2, r.stdout          # before training and after the epoch
    assert aucs[0] < 0.6 and aucs[-1] > 0.68, aucs   # a constant predictor has AUC 0.5
    assert "samples/s" in r.stdout and "sparse rows" in r.stdout


def run(*args, timeout=120):
    r = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                       cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def test_evaluate_reproduces_the_test_metric_printed_at_the_end_of_training(ctr_demo):
    """The CTR demo's model checked after training, as a user does it: train with a checkpoint
    directory, `paramshard export-model`, then examples/evaluate.py without servers prints the
    test metric the training printed at its end."""
    r, d, data = ctr_demo
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    trained = r.stdout
    printed = METRIC.findall(trained)
    assert len(printed) == 2, trained       # before training and after the epoch: the last is the model's
    assert f"paramshard export-model {d / 'ckpt'} --out model.pt" in trained
    out = run("-m", "paramshard", "export-model", d / "ckpt", "--out", d / "m.pt")
    assert "2 sparse tables" in out
    evaluated = METRIC.findall(run(ROOT / "examples/evaluate.py", "--model", d / "m.pt", *data))
    assert len(evaluated) == 1, evaluated
    # Same rows and parameters, so the same numbers; a rounding flip of the 4th digit is allowed for
    # a matrix product summed in another order (another thread count than the trainer's).
    for got, want in zip(map(float, evaluated[0]), map(float, printed[-1])):
        assert abs(got - want) <= 1e-4 + 1e-9, (evaluated, printed)
    assert printed[-1] != printed[0]        # the trained model, not the initial one


def test_word2vec_runs_and_prints_neighbours():
    r = launch("--servers", "2", "--trainers", "2", str(ROOT / "examples/word2vec.py"),
               "--epochs", "1", "--max-steps", "30")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "nearest neighbours" in r.stdout
    assert re.search(r"money: \w+", r.stdout)


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
