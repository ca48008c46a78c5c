"""No process outlives its job, without any launcher (the environment contract as
mpirun, ssh or Kubernetes would set it): kill one trainer or one server with
SIGKILL, and every other process must exit within PARAMSHARD_TIMEOUT + 10 s,
the servers with a non-zero code and a line naming the lost process."""
import dataclasses
import io
import os
import signal
import sys
import textwrap
import time

import pytest

from paramshard.env import ClusterEnv
from paramshard.launch.engines.local import child_environ
from paramshard.launch.engines.ports import free_ports
from paramshard.launch.engines.processes import Child
from paramshard.messages.status_lines import PEER_LOST_EXIT_CODE

# Starts, stops or kills server processes of its own: `make test` only, not `make check`.
pytestmark = pytest.mark.processes

TIMEOUT = 4.0

SCRIPT = textwrap.dedent("""
    import sys, time
    import torch, torch.nn as nn
    import paramshard as ps
    env = ps.init()
    torch.manual_seed(0)
    model = nn.Linear(64, 300)
    trainer = ps.Trainer(model, ps.optim.SGD(lr=0.01))
    print("training", flush=True)
    for step in range(int(sys.argv[1])):
        trainer.step(model(torch.ones(4, 64)).pow(2).mean())
        time.sleep(0.02)
    trainer.close()
    print("done", flush=True)
""")


class Job:
    """Servers and trainers as separate processes, each with its own log."""

    def __init__(self, tmp_path, mode: str, steps: int, servers=2, trainers=2):
        script = tmp_path / "train.py"
        script.write_text(SCRIPT)
        addresses = tuple(f"127.0.0.1:{p}" for p in free_ports(servers))
        base = ClusterEnv(role=None, servers=addresses, num_trainers=trainers, mode=mode, timeout=TIMEOUT,
                          min_block_size=1024)
        self.logs: dict[str, io.StringIO] = {}
        self.procs: dict[str, Child] = {}
        for i in range(servers):
            self._start(f"server {i}", [sys.executable, "-m", "paramshard", "server"],
                        dataclasses.replace(base, role="server", server_id=i))
        for i in range(trainers):
            self._start(f"trainer {i}", [sys.executable, str(script), str(steps)],
                        dataclasses.replace(base, role="trainer", trainer_id=i))

    def _start(self, name, argv, env):
        self.logs[name] = io.StringIO()
        self.procs[name] = Child(name, argv, child_environ(env), self.logs[name])

    def wait_for_line(self, name, text, deadline=60.0):
        end = time.monotonic() + deadline
        while text not in self.logs[name].getvalue():
            assert self.procs[name].poll() is None, f"{name} exited early:\n{self.logs[name].getvalue()}"
            assert time.monotonic() < end, f"{name} never printed {text!r}:\n{self.logs[name].getvalue()}"
            time.sleep(0.05)

    def wait_all_exit(self, deadline: float) -> float:
        start = time.monotonic()
        while any(p.poll() is None for p in self.procs.values()):
            if time.monotonic() - start > deadline:
                alive = [n for n, p in self.procs.items() if p.poll() is None]
                raise AssertionError(f"still running after {deadline} s: {alive}\n{self.dump()}")
            time.sleep(0.1)
        for p in self.procs.values():
            p.stop()            # joins the log pump
        return time.monotonic() - start

    def dump(self) -> str:
        return "\n".join(f"--- {n}\n{log.getvalue()}" for n, log in self.logs.items())

    def close(self):
        for p in self.procs.values():
            p.stop(grace=1)


@pytest.fixture
def job(tmp_path):
    made = []

    def make(*args, **kwargs):
        made.append(Job(tmp_path, *args, **kwargs))
        return made[-1]
    yield make
    for j in made:
        j.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_killed_trainer_ends_the_job_everywhere(job, mode):
    j = job(mode, steps=100000 if mode == "sync" else 300)
    j.wait_for_line("trainer 1", "training")
    j.wait_for_line("trainer 0", "training")
    os.kill(j.procs["trainer 1"].pid, signal.SIGKILL)
    if mode == "async":
        # Trainer 0 goes on with its own steps, which take as long as the machine's load makes
        # them: the deadline below is for the job's end, counted once its last trainer is done.
        end = time.monotonic() + 120
        while j.procs["trainer 0"].poll() is None:
            assert time.monotonic() < end, f"trainer 0 did not finish its steps within 120 s\n{j.dump()}"
            time.sleep(0.1)
    took = j.wait_all_exit(TIMEOUT + 10)
    for s in ("server 0", "server 1"):
        assert j.procs[s].poll() == 1, j.dump()
        assert "trainer 1" in j.logs[s].getvalue() and "lost" in j.logs[s].getvalue(), j.dump()
    if mode == "sync":     # the barrier step that needed trainer 1 fails at once, naming it
        assert j.procs["trainer 0"].poll() not in (0, None), j.dump()
        assert "trainers [1] lost their connection" in j.logs["trainer 0"].getvalue(), j.dump()
    else:                  # async: trainer 0 finishes its own work
        assert j.procs["trainer 0"].poll() == 0, j.dump()
    assert took < TIMEOUT + 10


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_killed_server_ends_the_job_everywhere(job, mode):
    j = job(mode, steps=100000)
    j.wait_for_line("trainer 0", "training")
    j.wait_for_line("trainer 1", "training")
    os.kill(j.procs["server 1"].pid, signal.SIGKILL)
    j.wait_all_exit(TIMEOUT + 10)
    for t in ("trainer 0", "trainer 1"):
        assert j.procs[t].poll() not in (0, None), j.dump()
        assert "server 1" in j.logs[t].getvalue(), j.dump()
    # It exits for its lost peer (the peer's deadline comes before the trainers'), saying so in its code.
    assert j.procs["server 0"].poll() == PEER_LOST_EXIT_CODE, j.dump()
    assert "lost" in j.logs["server 0"].getvalue(), j.dump()


def test_a_finished_job_exits_cleanly(job):
    j = job("sync", steps=5)
    j.wait_all_exit(60)
    assert all(p.poll() == 0 for p in j.procs.values()), j.dump()
