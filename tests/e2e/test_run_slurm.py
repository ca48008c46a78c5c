"""`paramshard run` under srun, on a throwaway Slurm cluster (tests/engines/slurm.py)."""
import pytest

from tests.e2e.run_job import ORACLE, PARAMSHARD, run_job
from tests.e2e.test_run_torchrun_mpi import assert_failure_named, assert_trained


@pytest.fixture(scope="module")
def slurm():
    from tests.engines.slurm import SlurmCluster, require_slurm
    require_slurm()
    with SlurmCluster() as cluster:
        yield cluster


def srun(cluster, n, *args, extra=("--kill-on-bad-exit=1",), malloc_tuned=True):
    return run_job(cluster.srun_argv(n, PARAMSHARD, "run", *args, extra=extra), env=cluster.environ(), timeout=120,
                   malloc_tuned=malloc_tuned)


def test_srun_trains_with_two_servers_and_two_trainers(slurm):
    result = srun(slurm, 4, "--servers", "2", ORACLE, malloc_tuned=False)     # each rank restarts itself tuned
    assert_trained(result)
    assert "2 servers, 2 trainers under slurm" in result.output, result
    assert f"rank 3 on {slurm.node_name}" in result.output, result


def test_srun_a_dead_trainer_ends_the_job_naming_its_rank(slurm):
    result = srun(slurm, 4, "--servers", "2", ORACLE, "--fail-trainer", "1")
    assert_failure_named(result)
    assert "task 3: Exited with exit code 3" in result.output, result     # srun's own words agree


def test_srun_store_port_from_the_flag(slurm):
    from paramshard.launch.engines.ports import free_ports
    port = free_ports(1)[0]
    result = srun(slurm, 3, "--servers", "1", "--store-port", str(port), ORACLE)
    assert_trained(result, trainers=2)


def test_srun_collective_mode_needs_no_server(slurm):
    result = srun(slurm, 2, "--servers", "0", "--mode", "collective", ORACLE)
    assert_trained(result, trainers=2)
    assert "0 servers, 2 trainers under slurm" in result.output, result
