"""The same example script, unchanged, under every engine: `paramshard launch`, mpirun,
torchrun and srun (Kubernetes: tests/e2e/test_k8s_execute.py runs it from the manifests)."""
import re

import pytest

from tests.e2e.run_job import PARAMSHARD, REPO, VENV_BIN, run_job

EXAMPLE = [str(REPO / "examples" / "digits_mlp.py"), "--epochs", "3"]


def accuracy(result) -> float:
    found = re.findall(r"epoch +3 +loss [0-9.]+ +test accuracy ([0-9.]+)", result.output)
    assert result.code == 0 and found, result
    assert not result.leftovers, result
    return float(found[-1])


@pytest.fixture(scope="module")
def slurm():
    from tests.engines.slurm import SlurmCluster, require_slurm
    require_slurm()
    with SlurmCluster() as cluster:
        yield cluster


def test_digits_under_paramshard_launch():
    """One job for two checks: the engines' bound at epoch 3, and the demo's own (it was
    test_examples.py's digits test: balanced dispatch, above 0.9 after 4 epochs). A 4th epoch
    does not change the first 3."""
    result = run_job([PARAMSHARD, "launch", "--servers", "2", "--trainers", "2", "--dispatch", "balanced",
                      EXAMPLE[0], "--epochs", "4"])
    assert accuracy(result) > 0.8
    acc = [float(a) for a in re.findall(r"test accuracy (\d\.\d+)", result.output)]
    assert acc and acc[-1] > 0.9, acc


def test_digits_under_mpirun():
    from tests.engines.mpi import mpirun_argv, require_mpi
    require_mpi()
    assert accuracy(run_job(mpirun_argv(4, PARAMSHARD, "run", "--servers", "2", *EXAMPLE))) > 0.8


def test_digits_under_torchrun():
    argv = [str(VENV_BIN / "torchrun"), "--standalone", "--nproc-per-node", "4", "--no-python", PARAMSHARD, "run",
            "--servers", "2", *EXAMPLE]
    assert accuracy(run_job(argv)) > 0.8


def test_digits_under_srun(slurm):
    argv = slurm.srun_argv(4, PARAMSHARD, "run", "--servers", "2", *EXAMPLE, extra=["--kill-on-bad-exit=1"])
    assert accuracy(run_job(argv, env=slurm.environ())) > 0.8
