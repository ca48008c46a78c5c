"""Secure by default: every launcher that owns the ranks' environment gives the job a secret.

Pure logic: LaunchConfig's secret, PARAMSHARD_INSECURE, `paramshard run`'s ways of
sharing a secret (rank 0 over MPI, a private file under srun and torchrun), the run
directory's secret for `paramshard stats`, and where a trainer's /metrics listens."""
import argparse
import dataclasses
import json
import os
import stat
import threading

import pytest

from paramshard.cli.jobs import stats
from paramshard.cli.jobs.run import _check_same_keys, _job_and_secret, _SecretFile
from paramshard.env import ClusterEnv
from paramshard.errors import ConfigError
from paramshard.launch.api import JobSpec, LaunchConfig
from paramshard.launch.rank.job_secret import fingerprint, shared_secret
from paramshard.launch.engines.ssh import with_own_hosts
from paramshard.launch.rank.world import World
from paramshard.observe.live.prometheus import trainer_bind_address
from paramshard.observe.run_records.run_dir import RunDir
from paramshard.transport.security import Security


def config(**fields) -> LaunchConfig:
    return LaunchConfig(module="train", **fields)


# -- paramshard launch ------------------------------------------------------------
def test_a_launch_without_a_secret_gets_a_random_one_its_ranks_share():
    a, b = config(), config()
    assert a.secret and b.secret and a.secret != b.secret
    assert len(a.secret) >= 40                                      # 256 bits, url-safe
    assert dataclasses.replace(a, trainers=3).secret == a.secret    # the same job keeps it
    spec = JobSpec.build(a, ["127.0.0.1:1"], python="python")
    assert {r.environ()["PARAMSHARD_SECRET"] for r in (*spec.servers, *spec.trainers)} == {a.secret}
    assert Security.from_env(spec.trainers[0].env) is not None
    assert "PARAMSHARD_INSECURE" not in spec.trainers[0].environ()


def test_a_secret_or_keys_the_user_gave_are_kept_and_insecure_makes_none():
    assert config(secret="mine").secret == "mine"
    assert config(keys_dir="/keys").secret is None
    plain = config(insecure=True)
    assert plain.secret is None
    rank = JobSpec.build(plain, ["127.0.0.1:1"], python="python").trainers[0]
    assert Security.from_env(rank.env) is None
    assert rank.environ()["PARAMSHARD_INSECURE"] == "1" and "PARAMSHARD_SECRET" not in rank.environ()
    with pytest.raises(ConfigError, match="PARAMSHARD_INSECURE=1 .--insecure. asks for plain TCP, but "
                                          "PARAMSHARD_SECRET is set too"):
        config(insecure=True, secret="mine")


@pytest.mark.parametrize("value,expected", [("1", True), ("true", True), ("0", False), ("", False),
                                            ("false", False)])
def test_paramshard_insecure_is_read_as_a_yes_or_no(value, expected):
    assert ClusterEnv.from_environ({"PARAMSHARD_INSECURE": value}).insecure is expected


def test_a_garbled_paramshard_insecure_is_named_not_guessed():
    with pytest.raises(ConfigError, match="PARAMSHARD_INSECURE='off': expected 1"):
        ClusterEnv.from_environ({"PARAMSHARD_INSECURE": "off"})
    with pytest.raises(ConfigError, match="PARAMSHARD_KEYS_DIR is set too"):
        ClusterEnv.from_environ({"PARAMSHARD_INSECURE": "1", "PARAMSHARD_KEYS_DIR": "/k"})


# -- the run directory and paramshard stats ------------------------------------------
def test_the_generated_secret_is_in_the_run_directory_for_this_user_only(tmp_path, monkeypatch):
    run = RunDir(tmp_path / "run", "job-a")
    run.write_secret("s3cret")
    path = tmp_path / "run" / "secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    run.write_secret("again")                       # a reused run directory: replaced, still private
    assert path.read_text().strip() == "again" and stat.S_IMODE(path.stat().st_mode) == 0o600
    run.close()
    (tmp_path / "run" / "config.json").write_text(json.dumps({
        "job_id": "job-a", "launch": {"secret": "<redacted>"},
        "ranks": {"server 0": {"environ": {"PARAMSHARD_SERVERS": "127.0.0.1:5"}}}}))
    monkeypatch.delenv("PARAMSHARD_SECRET", raising=False)
    args = argparse.Namespace(servers=None, run_dir=str(tmp_path / "run"))
    env = stats._target(args)
    assert (env.secret, env.job_id, env.servers) == ("again", "job-a", ("127.0.0.1:5",))
    path.unlink()                                   # a secret the user gave is never written: ask for it
    with pytest.raises(ConfigError, match="set the same PARAMSHARD_SECRET in this shell"):
        stats._target(args)
    monkeypatch.setenv("PARAMSHARD_SECRET", "given")
    assert stats._target(args).secret == "given"


# -- paramshard run: a private file under srun and torchrun -----------------------------
def test_the_first_rank_writes_the_secret_and_the_others_read_it(tmp_path):
    environ = {"PARAMSHARD_SECRET_DIR": str(tmp_path / "secrets")}
    results = [None] * 8
    barrier = threading.Barrier(8)

    def rank(i):
        barrier.wait()
        results[i] = shared_secret(environ, "torchrun-abc-r0")
    threads = [threading.Thread(target=rank, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len({secret for secret, _, _ in results}) == 1                   # one secret, whoever came first
    assert sum(made for _, _, made in results) == 1
    path = results[0][1]
    assert path.parent == tmp_path / "secrets" and path.name == "torchrun-abc-r0.secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert sorted(os.listdir(path.parent)) == [path.name]                   # no temporary file left
    assert shared_secret(environ, "torchrun-abc-r1")[0] != results[0][0]    # another job, another secret


def test_a_secret_file_others_could_read_is_refused(tmp_path):
    environ = {"PARAMSHARD_SECRET_DIR": str(tmp_path / "secrets")}
    _, path, _ = shared_secret(environ, "slurm-7.0")
    path.chmod(0o644)
    with pytest.raises(ConfigError, match=r"secret file .* has mode 0644: others may read .*set PARAMSHARD_SECRET"):
        shared_secret(environ, "slurm-7.0")
    path.chmod(0o600)
    (tmp_path / "secrets").chmod(0o755)
    with pytest.raises(ConfigError, match=r"secrets directory .* has mode 0755"):
        shared_secret(environ, "slurm-7.0")


def test_a_job_id_cannot_lead_the_secret_file_out_of_its_directory(tmp_path):
    environ = {"PARAMSHARD_SECRET_DIR": str(tmp_path / "secrets")}
    _, path, _ = shared_secret(environ, "../../etc/x")
    assert path.parent == tmp_path / "secrets" and "/" not in path.name and not path.name.startswith(".")


class FakeExchange:
    """Rank 0's records as every rank would get them back from an allgather."""

    def __init__(self, trusted, first=None):
        self.trusted, self.first, self.sent = trusted, first, []

    def allgather(self, record):
        self.sent.append(record)
        return [self.first if self.first is not None else record]


def test_under_mpirun_rank_0_makes_the_secret_and_sends_it_over_mpi():
    world0, world1 = World("openmpi", 0, 3, "n0"), World("openmpi", 1, 3, "n0")
    base = ClusterEnv(role=None)
    rank0 = FakeExchange(trusted=True)
    job, secret, file = _job_and_secret(base, world0, rank0, {})
    assert secret and job.startswith("openmpi-") and file is None
    rank1 = FakeExchange(trusted=True, first=rank0.sent[0])
    assert _job_and_secret(base, world1, rank1, {}) == (job, secret, None)
    assert rank1.sent == [{}]                                   # only rank 0's record carries it
    # Every rank takes part even with a secret of its own, and a mismatch is named.
    given = dataclasses.replace(base, secret="mine")
    with pytest.raises(ConfigError, match="this rank has PARAMSHARD_SECRET.* and rank 0 has not"):
        _job_and_secret(given, world1, FakeExchange(trusted=True, first=rank0.sent[0]), {})
    assert _job_and_secret(given, world0, FakeExchange(trusted=True), {})[1] == "mine"


def test_an_open_store_never_carries_the_secret(tmp_path):
    world = World("torchrun", 1, 2, "n0", job_key="torchrun-x-r0")
    store = FakeExchange(trusted=False)
    environ = {"PARAMSHARD_SECRET_DIR": str(tmp_path)}
    job, secret, file = _job_and_secret(ClusterEnv(role=None), world, store, environ)
    assert job == "torchrun-x-r0" and secret and store.sent == []
    assert file.path.read_text().strip() == secret
    assert _job_and_secret(ClusterEnv(role=None, insecure=True), world, store, environ) == (job, None, None)


def test_ranks_that_read_different_secret_files_stop_with_the_fix(tmp_path):
    key = fingerprint(Security.from_secret("a", "j").server_public)
    other = fingerprint(Security.from_secret("b", "j").server_public)
    records = [{"rank": 0, "node": "n0", "keys": key}, {"rank": 1, "node": "n0", "keys": key},
               {"rank": 2, "node": "n1", "keys": other}]
    _check_same_keys(records[:2], _SecretFile(tmp_path / "x.secret", True))
    with pytest.raises(ConfigError, match=r"rank 2 on n1 did not read what rank 0 on n0 read .*"
                                          r"PARAMSHARD_SECRET_DIR"):
        _check_same_keys(records, _SecretFile(tmp_path / "x.secret", True))


# -- where a trainer's /metrics listens ----------------------------------------------------
def test_a_trainer_serves_metrics_on_its_own_host_not_every_interface():
    trainer = ClusterEnv(role="trainer", servers=("10.0.0.1:5",))
    assert trainer_bind_address(dataclasses.replace(trainer, host="10.0.0.2")) == "10.0.0.2"
    assert trainer_bind_address(ClusterEnv(role="trainer", servers=("127.0.0.1:5",))) == "127.0.0.1"
    assert trainer_bind_address(trainer) == "0.0.0.0"       # told nothing (a pod): every interface


def test_ssh_ranks_are_told_their_own_hosts_address():
    spec = JobSpec.build(config(trainers=2), ["10.0.0.1:5"], python="python", server_hosts=["a"],
                         trainer_hosts=["a", "b"], threads={})
    told = with_own_hosts(spec, {"a": "10.0.0.1", "b": "10.0.0.2"})
    assert [r.env.host for r in (*told.servers, *told.trainers)] == ["10.0.0.1", "10.0.0.1", "10.0.0.2"]
    assert told.trainers[1].environ()["PARAMSHARD_HOST"] == "10.0.0.2"
