"""The CTR demo's model checked after training, as a user does it: train with a checkpoint
directory, `paramshard export-model`, then examples/evaluate.py without servers prints the
test metric the training printed at its end."""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
METRIC = re.compile(r"test AUC (\d\.\d+)\s+logloss (\d\.\d+)")


def run(*args, timeout=120):
    r = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                       cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def test_evaluate_reproduces_the_test_metric_printed_at_the_end_of_training(tmp_path):
    data = ["--train-rows", "20000", "--test-rows", "5000", "--workdir", tmp_path / "work"]
    trained = run("-m", "paramshard", "launch", "--servers", "2", "--trainers", "2",
                  "--checkpoint-dir", tmp_path / "ckpt", ROOT / "examples/ctr_wide_deep.py", *data)
    printed = METRIC.findall(trained)
    assert len(printed) == 2, trained       # before training and after the epoch: the last is the model's
    assert f"paramshard export-model {tmp_path / 'ckpt'} --out model.pt" in trained
    out = run("-m", "paramshard", "export-model", tmp_path / "ckpt", "--out", tmp_path / "m.pt")
    assert "2 sparse tables" in out
    evaluated = METRIC.findall(run(ROOT / "examples/evaluate.py", "--model", tmp_path / "m.pt", *data))
    assert len(evaluated) == 1, evaluated
    # Same rows and parameters, so the same numbers; a rounding flip of the 4th digit is allowed for
    # a matrix product summed in another order (another thread count than the trainer's).
    for got, want in zip(map(float, evaluated[0]), map(float, printed[-1])):
        assert abs(got - want) <= 1e-4 + 1e-9, (evaluated, printed)
    assert printed[-1] != printed[0]        # the trained model, not the initial one
