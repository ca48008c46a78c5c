"""runtime.init with no cluster around: a standalone run gets the torch threads a trainer rank of
the job it stands for gets from `paramshard launch` (issue 23: left at torch's thread per core,
the CTR app ran about 10x slower standalone than launched on a shared host). Oracle: the launcher's
own JobSpec for that job on this host."""
import pytest
import torch

from paramshard import runtime
from paramshard.env import ClusterEnv
from paramshard.launch import api as launch_api
from paramshard.launch.api import JobSpec, LaunchConfig


@pytest.fixture
def standalone(monkeypatch):
    """No role taken yet, no thread variable of the user's, 8 CPUs; torch's threads put back after."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(launch_api, "usable_cpus", lambda: 8)     # the launcher's reading ...
    monkeypatch.setattr(runtime, "usable_cpus", lambda: 8)        # ... and the standalone run's
    threads = torch.get_num_threads()
    made = []
    yield made
    for env in made:
        if env.local_server is not None:
            env.local_server.close()
    torch.set_num_threads(threads)


def launched_trainer_threads(**config) -> int:
    spec = JobSpec.build(LaunchConfig(module="train", insecure=True, **config),
                         ["127.0.0.1:1"] * config.get("servers", 1), "python", collective_addr="127.0.0.1:2")
    return int(dict(spec.trainers[0].extra_environ)["OMP_NUM_THREADS"])


def test_standalone_with_its_in_process_server_takes_the_threads_of_a_1_server_1_trainer_rank(standalone):
    torch.set_num_threads(7)                        # torch's own choice: not what a rank gets
    env = runtime.init(ClusterEnv(role=None))
    standalone.append(env)
    assert env.local_server is not None and env.role == "trainer"
    assert torch.get_num_threads() == launched_trainer_threads(servers=1, trainers=1) == 4


def test_standalone_collective_takes_the_threads_of_a_lone_trainer_rank(standalone):
    torch.set_num_threads(7)
    env = runtime.init(ClusterEnv(role=None, mode="collective"))
    standalone.append(env)
    assert env.local_server is None and env.role == "trainer"
    assert torch.get_num_threads() == launched_trainer_threads(servers=0, trainers=1, mode="collective") == 8


def test_a_users_omp_num_threads_is_left_as_torch_read_it(standalone, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    torch.set_num_threads(3)
    standalone.append(runtime.init(ClusterEnv(role=None)))
    assert torch.get_num_threads() == 3
