"""`paramshard run` under torchrun and mpirun (one machine), and with the explicit contract.

Every job runs tests/e2e/scripts/sync_oracle.py, which checks that sync training
through the servers ends exactly where one PyTorch process ends."""
import re
import shutil

import pytest

from paramshard.env import check_server_count
from paramshard.errors import ConfigError
from tests.e2e.in_process import cli_in_process
from tests.e2e.run_job import ORACLE, PARAMSHARD, VENV_BIN, run_job
from tests.engines.sshd import ssh_hosts  # noqa: F401  (the fixture)

TORCHRUN = str(VENV_BIN / "torchrun")


def torchrun(n, *args):
    return [TORCHRUN, "--standalone", "--nproc-per-node", str(n), "--no-python", PARAMSHARD, "run", *args]


def assert_trained(result, trainers=2):
    assert result.code == 0, result
    for t in range(trainers):
        assert re.search(rf"trainer {t} of {trainers}: oracle ok", result.output), result
    assert "ORACLE FAILED" not in result.output, result
    assert not result.leftovers, result


def assert_failure_named(result, trainer=1, rank=3):
    assert result.code != 0, result
    assert f"trainer {trainer}: failing on purpose" in result.output, result
    # The servers (and the surviving trainer's error) name the dead rank and its host.
    assert re.search(rf"trainer {trainer}: rank {rank} on \S+", result.output), result
    assert not result.leftovers, result
    assert result.seconds < 60, result


@pytest.fixture(scope="module")
def torchrun_2_2(tmp_path_factory):
    """torchrun of 2 servers + 2 trainers with a run directory, as a user types it (without the
    malloc settings, which `paramshard run` then restarts each rank with): (result, run dir)."""
    run = tmp_path_factory.mktemp("torchrun") / "run"
    return run_job(torchrun(4, "--servers", "2", "--run-dir", str(run), ORACLE), malloc_tuned=False), run


def test_torchrun_trains_with_two_servers_and_two_trainers(torchrun_2_2):
    result, _ = torchrun_2_2
    assert_trained(result)
    assert "2 servers, 2 trainers under torchrun" in result.output, result


def test_torchrun_a_dead_trainer_ends_the_job_naming_its_rank():
    result = run_job(torchrun(4, "--servers", "2", ORACLE, "--fail-trainer", "1"))
    assert_failure_named(result)
    assert "rank      : 3" in result.output, result        # torchrun's own summary agrees


def test_servers_must_leave_a_trainer():
    """The end-to-end test of `paramshard run`'s refusals: each rank refuses, and the message
    reaches the user through torchrun. The other refusals are checked in process below."""
    result = run_job(torchrun(2, "--servers", "2", ORACLE), timeout=60)
    assert result.code != 0
    assert "--servers 2 leaves no trainer among 2 ranks (torchrun)" in result.output, result


@pytest.fixture
def no_engine(monkeypatch):
    """This process's environment as a rank's without an engine, already malloc-tuned (so
    `paramshard run` does not start itself again)."""
    for name in list(__import__("os").environ):
        if name.startswith(("PARAMSHARD_", "OMPI_", "PMI_", "SLURM_", "TORCHELASTIC_")) or \
                name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")


def test_no_engine_says_how_to_start_one(capsys, no_engine):
    code, out, err = cli_in_process(capsys, "run", "--servers", "1", ORACLE)
    assert code == 2, out + err
    assert "no engine found" in err and "mpirun" in err, out + err


def test_explicit_contract_runs_each_role(tmp_path):
    """Kubernetes-style: every process is told its role and the addresses."""
    import sys

    from paramshard.launch.engines.ports import free_ports
    ports = free_ports(2)
    servers = ",".join(f"127.0.0.1:{p}" for p in ports)
    base = {"PARAMSHARD_SERVERS": servers, "PARAMSHARD_TRAINERS": "2", "PARAMSHARD_JOB_ID": "explicit",
            "PARAMSHARD_TIMEOUT": "30"}
    roles = [{"PARAMSHARD_ROLE": "server", "PARAMSHARD_SERVER_ID": str(i)} for i in range(2)]
    roles += [{"PARAMSHARD_ROLE": "trainer", "PARAMSHARD_TRAINER_ID": str(i)} for i in range(2)]
    script = tmp_path / "all_roles.py"
    lines = ["import os, subprocess, sys",
             f"roles = {roles!r}", f"base = {base!r}",
             f"procs = [subprocess.Popen([{PARAMSHARD!r}, 'run', '--servers', '2', {ORACLE!r}], "
             "env={**os.environ, **base, **r}) for r in roles]",
             "codes = [p.wait(timeout=90) for p in procs]",
             "print('codes', codes); sys.exit(max(codes))"]
    script.write_text("\n".join(lines) + "\n")
    result = run_job([sys.executable, str(script)], timeout=120)
    assert "codes [0, 0, 0, 0]" in result.output, result
    assert_trained(result)


def mpirun_or_skip():
    from tests.engines.mpi import require_mpi
    require_mpi()
    return shutil.which("mpirun")


def mpirun(n, *args):
    from tests.engines.mpi import mpirun_argv
    return mpirun_argv(n, PARAMSHARD, "run", *args)


def test_mpirun_trains_with_two_servers_and_two_trainers():
    mpirun_or_skip()
    result = run_job(mpirun(4, "--servers", "2", ORACLE), malloc_tuned=False)
    assert_trained(result)
    assert "2 servers, 2 trainers under openmpi" in result.output, result


def test_mpirun_a_dead_trainer_ends_the_job_naming_its_rank():
    mpirun_or_skip()
    result = run_job(mpirun(4, "--servers", "2", ORACLE, "--fail-trainer", "1"))
    assert_failure_named(result)
    assert result.code == 3, result                      # mpirun passes the first failure's code on


def test_mpirun_any_split_of_ranks():
    """Another split than the 2 + 2 above (each job starts every rank anew: 2-3 s of CPU each)."""
    mpirun_or_skip()
    result = run_job(mpirun(5, "--servers", "3", ORACLE))
    assert_trained(result, trainers=2)
    assert "3 servers, 2 trainers under openmpi" in result.output, result


def test_the_same_script_under_paramshard_launch():
    result = run_job([PARAMSHARD, "launch", "--servers", "2", "--trainers", "2", ORACLE])
    assert_trained(result)


def test_mpirun_over_two_hosts_servers_advertise_their_own_host(ssh_hosts):
    """Two sshd "hosts" on 127.0.0.2 and 127.0.0.3; --map-by node puts server 0 on the
    first and server 1 on the second, and each must advertise the host it runs on."""
    mpirun_or_skip()
    from tests.engines.mpi import mpirun_argv
    hosts = ssh_hosts(["127.0.0.2", "127.0.0.3"])
    argv = mpirun_argv(4, PARAMSHARD, "run", "--servers", "2", ORACLE, hosts=hosts,
                       extra=["--map-by", "node"])
    result = run_job(argv)
    assert_trained(result)
    assert re.search(r"server 0: rank 0 on \S+ at 127\.0\.0\.2:\d+; server 1: rank 1 on \S+ at 127\.0\.0\.3:\d+",
                     result.output), result



def test_torchrun_with_a_run_directory_every_rank_writes_its_records(torchrun_2_2):
    import json
    import subprocess
    import sys
    result, run = torchrun_2_2
    assert_trained(result)
    ranks = sorted(p.name for p in (run / "ranks").iterdir())
    assert ranks == ["server-0.json", "server-1.json", "trainer-0.json", "trainer-1.json"]
    assert sorted(p.name for p in (run / "metrics").iterdir()) == \
        ["server-0.jsonl", "server-1.jsonl", "trainer-0.jsonl", "trainer-1.jsonl"]
    last = [json.loads(line) for line in (run / "metrics/trainer-1.jsonl").read_text().splitlines()][-1]
    assert last["kind"] == "trainer" and last["trainer"] == 1 and last["step"] > 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["exit_code"] == 0 and summary["totals"]["steps"]["1"] == last["step"]
    # each rank wrote its TensorBoard files too, read back by TensorBoard's own reader
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    assert sorted(p.name for p in (run / "tensorboard").iterdir()) == \
        ["server-0", "server-1", "trainer-0", "trainer-1"]
    events = EventAccumulator(str(run / "tensorboard/trainer-1"), size_guidance={"scalars": 0})
    events.Reload()
    assert events.Scalars("trainer/samples_per_s")[-1].step == last["step"]
    rep = subprocess.run([sys.executable, "-m", "paramshard", "report", str(run)], capture_output=True, text=True,
                         timeout=120)
    assert rep.returncode == 0, rep.stderr
    assert (run / "report/throughput.png").stat().st_size > 1000


# Secure by default: no PARAMSHARD_SECRET, yet every connection is CurveZMQ.
PROBE = str(ORACLE).replace("sync_oracle.py", "secure_probe.py")


def assert_one_secret_and_plain_clients_refused(result, trainers=2):
    assert result.code == 0, result
    digests = set(re.findall(r"trainer \d secret (\S+)", result.output))
    assert len(digests) == 1 and "None" not in digests, result          # one secret, every trainer has it
    assert result.output.count("plain client refused") == trainers, result
    assert len(re.findall(r"trainer \d trained", result.output)) == trainers, result
    assert not result.leftovers, result


def test_torchrun_without_a_secret_shares_one_through_a_private_file(tmp_path):
    import stat
    secrets = tmp_path / "secrets"
    result = run_job(torchrun(3, "--servers", "1", PROBE), env={"PARAMSHARD_SECRET_DIR": str(secrets)})
    assert_one_secret_and_plain_clients_refused(result)
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o700
    assert list(secrets.iterdir()) == [], "the file outlived the rendezvous"


def test_mpirun_without_a_secret_rank_0_sends_one_over_mpi(tmp_path):
    mpirun_or_skip()
    secrets = tmp_path / "secrets"
    result = run_job(mpirun(3, "--servers", "1", PROBE), env={"PARAMSHARD_SECRET_DIR": str(secrets)})
    assert_one_secret_and_plain_clients_refused(result)
    assert not secrets.exists(), "under mpirun the secret goes over MPI, not through a file"


# Collective and hybrid modes: the same oracle script (one process with the combined
# batch), the dense gradients averaged by allreduce among the trainers.

def test_torchrun_collective_mode_needs_no_server():
    result = run_job(torchrun(2, "--servers", "0", "--mode", "collective", ORACLE))
    assert_trained(result)
    assert "0 servers, 2 trainers under torchrun" in result.output, result
    assert "joined the gloo group of 2 trainers" in result.output, result


def test_mpirun_hybrid_mode():
    """Collective mode's allreduce under an engine: torchrun above; hybrid's (a server for the
    tables, the dense part by allreduce) under mpirun here."""
    mpirun_or_skip()
    result = run_job(mpirun(4, "--servers", "1", "--mode", "hybrid", ORACLE))
    assert_trained(result, trainers=3)
    assert "averaged by allreduce over 3 trainers (hybrid mode)" in result.output, result


def test_collective_mode_refuses_servers_and_other_modes_need_one(capsys, no_engine):
    with pytest.raises(ConfigError, match="--mode collective has no parameter servers"):
        check_server_count("collective", 1)
    with pytest.raises(ConfigError, match="sync mode needs at least one server"):
        check_server_count("sync", 0)
    check_server_count("collective", 0), check_server_count("hybrid", 1)
    # `paramshard run` refuses them before it looks for an engine (as every rank under torchrun would).
    code, out, err = cli_in_process(capsys, "run", "--servers", "1", "--mode", "collective", ORACLE)
    assert code == 2 and "--mode collective has no parameter servers" in err, out + err
    code, out, err = cli_in_process(capsys, "run", "--servers", "0", ORACLE)
    assert code == 2 and "sync mode needs at least one server" in err, out + err


def test_collective_a_dead_trainer_ends_the_job_within_seconds():
    result = run_job(torchrun(2, "--servers", "0", "--mode", "collective", ORACLE, "--fail-trainer", "1"))
    assert result.code != 0, result
    assert "trainer 1: failing on purpose" in result.output, result
    assert not result.leftovers, result
    assert result.seconds < 60, result


@pytest.mark.parametrize("mode, servers", [("collective", "0"), ("hybrid", "2")])
def test_the_same_script_in_collective_and_hybrid_modes_under_paramshard_launch(mode, servers):
    result = run_job([PARAMSHARD, "launch", "--servers", servers, "--trainers", "2", "--mode", mode, ORACLE])
    assert_trained(result)
