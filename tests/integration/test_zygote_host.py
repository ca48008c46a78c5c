"""The shared fork server (launch/engines/zygote_host.py, PARAMSHARD_FORK_SERVER): each launcher
that connects gets its own zygote, forked from the host's imports; a launcher that goes takes its
ranks with it and no one else's; the host's end takes everything. One host serves the module."""
import os
import signal
import sys

import pytest

from paramshard.errors import ConfigError
from paramshard.launch.api import MALLOC_TUNABLES
from paramshard.launch.engines import fork_server, zygote_host
from tests.integration.fork_ranks import gone, rank_script

pytestmark = pytest.mark.processes

# A local rank's environment (launch/engines/local.py child_environ), as the host's starter assumes.
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
ENV.setdefault("GLIBC_TUNABLES", MALLOC_TUNABLES)


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    room = tmp_path_factory.mktemp("host")
    os.chmod(room, 0o700)
    path = str(room / "zygote.sock")
    proc = zygote_host.start(path)
    yield proc, path
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def launcher(path: str) -> fork_server.ForkServer:
    return fork_server.ForkServer(fork_server.zygote_environ(ENV)).connect(path)


def test_a_rank_of_a_shared_zygote_runs_with_its_own_environment_and_exit_code(host, tmp_path):
    _, path = host
    server = launcher(path)
    try:
        assert server.problem is None and server.python == sys.executable
        script = rank_script(tmp_path, """
            import os, sys
            print(os.environ["PSTEST_WHO"], sorted(m for m in ("torch", "pandas", "numba") if m in sys.modules))
            sys.exit(7)
        """)
        assert server.reason_not_to_fork([sys.executable, script], ENV) is None
        proc = server.fork([sys.executable, script], {**ENV, "PSTEST_WHO": "rank-a"})
        assert proc.wait(30) == 7
        assert proc.stdout.read().split("\n")[0] == "rank-a ['numba', 'pandas', 'torch']"
        # A load-time variable the host was not started with: that rank starts anew.
        why = server.reason_not_to_fork([sys.executable, script], {**ENV, "PYTHONOPTIMIZE": "1"})
        assert why is not None and "PYTHONOPTIMIZE" in why
    finally:
        server.close()


def test_a_launcher_that_goes_takes_its_ranks_and_no_one_elses(host, tmp_path):
    proc_host, path = host
    sleeper = rank_script(tmp_path, "import time; time.sleep(600)\n", "sleep.py")
    first, second = launcher(path), launcher(path)
    try:
        assert first.pid != second.pid                       # a zygote each
        a = first.fork([sys.executable, sleeper], ENV)
        b = second.fork([sys.executable, sleeper], ENV)
        first.close()
        assert gone(a.pid) and gone(first.pid)
        assert b.poll() is None and not gone(b.pid, timeout=0.3)
        assert proc_host.poll() is None
        third = launcher(path)                               # the host still serves
        c = third.fork([sys.executable, rank_script(tmp_path, "print('third')\n", "third.py")], ENV)
        assert c.wait(30) == 0
        third.close()
        # The host's end: every zygote and rank dies with it (their parent-death signal).
        os.killpg(proc_host.pid, signal.SIGKILL)
        proc_host.wait(10)
        assert gone(b.pid) and gone(second.pid)
        assert b.wait(10) == -signal.SIGKILL
    finally:
        second.close()
    with pytest.raises(ConfigError, match="no shared fork server answered"):
        launcher(path)
