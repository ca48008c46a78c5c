import dataclasses
import os
import signal
import sys
import threading

import pytest

from paramshard.env import ClusterEnv
from paramshard.launch.engines.ports import free_ports
from paramshard.launch.engines.local import child_environ
from paramshard.launch.engines.processes import Child, stop_all
from paramshard.server.assembly import build_server
from tests.xdist_groups import XdistGroups


def pytest_configure(config):
    """The tests that signal a launcher need SIGINT and SIGHUP at their defaults. A runner that
    starts the suite in the background (``nohup make test &``, some CI runners) hands it those
    signals ignored; every child inherits that, and a launcher keeps an ignored signal ignored
    (launch/supervision/signals.py: as a nohup'ed launcher should). Restore them for this session."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
    # The jobs the suite launches fork their ranks from one pre-imported interpreter
    # (`launch --fork`, launch/fork_server.py): a rank's start is then a fork, not 1-2 s of CPU
    # for Python, torch, pandas and numba. PARAMSHARD_FORK=0 runs the suite with every rank a new
    # process; tests of that path set it to 0 themselves (e.g. tests/e2e/test_launch_signals.py).
    os.environ.setdefault("PARAMSHARD_FORK", "1")
    config.pluginmanager.register(XdistGroups(), "paramshard-xdist-groups")
    _start_fork_host(config)


def _start_fork_host(config) -> None:
    """One shared fork server per test process that launches jobs (each xdist worker; not the
    controller, not `make check`, whose servers are threads): every `paramshard launch` of the
    suite gets its zygote forked from it (launch/engines/zygote_host.py) instead of importing
    torch, pandas and numba anew (2-3 s of CPU a job). Stopped by PID at the session's end."""
    # PARAMSHARD_FORK_SERVER set (even empty, `PARAMSHARD_FORK_SERVER= make test`: every launcher its
    # own zygote, as before): the suite starts none.
    if (os.environ.get("PARAMSHARD_FORK") != "1" or "PARAMSHARD_FORK_SERVER" in os.environ
            or os.environ.get("PARAMSHARD_TEST_SERVERS") == "threads"
            or (getattr(config.option, "numprocesses", None) and "PYTEST_XDIST_WORKER" not in os.environ)):
        return
    # scikit-learn sets KMP_DUPLICATE_LIB_OK and KMP_INIT_AT_FORK when imported (some tests compare
    # with it): variables read when a library loads (fork_server LOAD_TIME_PREFIXES), so once one
    # test imported it, every later job's ranks would differ from the host's and start anew
    # (found by checking the host after each test). Its values from the start.
    os.environ.setdefault("KMP_DUPLICATE_LIB_OK", "True")
    os.environ.setdefault("KMP_INIT_AT_FORK", "FALSE")
    import tempfile
    from paramshard.launch.engines import zygote_host
    room = tempfile.mkdtemp(prefix="paramshard-fork-host-")      # 0700: only this user connects
    path = os.path.join(room, "zygote.sock")
    proc = zygote_host.start(path, wait_ready=False)     # it imports while the first tests run
    os.environ["PARAMSHARD_FORK_SERVER"] = path
    config._paramshard_fork_host = (proc, room)


def pytest_unconfigure(config):
    started = getattr(config, "_paramshard_fork_host", None)
    if started is None:
        return
    proc, room = started
    os.environ.pop("PARAMSHARD_FORK_SERVER", None)
    # Its group: the host, the zygotes of launchers still connected and their ranks (which also
    # die of their parent-death signal with the host).
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)
    import shutil
    shutil.rmtree(room, ignore_errors=True)


# Markers by cost (pyproject.toml), applied here so that a file need not say them: the engine a
# test needs (by the fixture it asks for, or by its file); `slow` for the tests whose items took
# over ~20 s each (`--durations`, 2 shared cores, 2026-11-29); `soak` for those that run a job
# through many disturbances. `-m "not slow and not soak and not engine"` for a quicker run.
ENGINE_FIXTURES = {"ssh_hosts": "engine_ssh", "netns_lab": "engine_ssh", "shaped_lab": "engine_ssh", "engines": "engine_ssh",
                   "mpi": "engine_mpi", "slurm_cluster": "engine_slurm", "kafka_broker": "engine_kafka"}
ENGINE_FILES = {"test_ssh_launch.py": "engine_ssh", "test_ssh_remove_host.py": "engine_ssh",
                "test_ssh_scale.py": "engine_ssh", "test_run_torchrun_mpi.py": "engine_mpi",
                "test_run_slurm.py": "engine_slurm", "test_run_example.py": "engine_slurm"}
SLOW = {  # file::test (every parametrization)
    "test_checkpoint_launch.py::test_a_hung_server_is_killed_and_restarted_in_place_for_one_restart",
    "test_ctr_app.py::test_an_elastic_app_job_trains_every_row_once_per_epoch_while_a_trainer_leaves_and_one_joins",
    "test_ctr_app.py::test_deepfm_on_2_servers_and_2_trainers_beats_sklearn_logistic_regression",
    "test_ctr_app.py::test_one_process_without_launcher_every_model",
    "test_elastic_data.py::test_every_record_once_while_trainers_die_join_and_leave",
    "test_elastic_matrix.py::test_smoke_combinations",
    "test_elastic_servers.py::test_a_sync_job_with_prefetching_scales_2_3_2",
    "test_exact_replay.py::*",
    "test_run_example.py::test_digits_under_torchrun",
    "test_run_torchrun_mpi.py::*",
    "test_ssh_launch.py::test_many_hosts_in_network_namespaces_and_a_cut_host_fails_the_job",
    "test_ssh_launch.py::test_two_hosts_train_like_the_local_launcher_and_a_rerun_copies_nothing",
    "test_ssh_remove_host.py::*",
    "test_ssh_scale.py::*",
    "test_checkpoint_during_scale.py::*",
    "test_collective_modes.py::test_collective_equals_one_process_with_the_combined_batch",
}
SOAK = {
    "test_elastic_data.py::test_every_record_once_while_trainers_die_join_and_leave",
    "test_elastic_matrix.py::test_smoke_combinations",
    "test_exact_replay.py::*",
    "test_recovery_every_server.py::*",
    "test_ctr_app.py::test_an_elastic_app_job_trains_every_row_once_per_epoch_while_a_trainer_leaves_and_one_joins",
}


def _listed(item, names: set[str]) -> bool:
    name = item.path.name
    return f"{name}::*" in names or f"{name}::{getattr(item, 'originalname', item.name)}" in names


# tryfirst: pytest-xdist's own hook (--dist loadgroup) reads the xdist_group marks set here.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        name = item.path.name
        engines = {ENGINE_FIXTURES[f] for f in getattr(item, "fixturenames", ()) if f in ENGINE_FIXTURES}
        if name in ENGINE_FILES:
            engines.add(ENGINE_FILES[name])
        for marker in sorted(engines):
            item.add_marker(marker)
        if engines:
            item.add_marker("engine")
            # `make test` runs two pytest-xdist workers: the engines (sshd, slurmctld, network
            # namespaces) are machine-wide and started once per worker, so their tests share one.
            item.add_marker(pytest.mark.xdist_group("engines"))
        elif _uses_a_module_fixture(item):
            # A module-scoped fixture (a trained job, a downloaded data set, a zygote) is made once
            # per worker that runs one of its users: `--dist loadgroup` spread a module's items
            # over both workers, and each made it. Its users share one worker, so it is made once.
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
        if _listed(item, SLOW):
            item.add_marker("slow")
        if _listed(item, SOAK):
            item.add_marker("soak")


def _uses_a_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(defs and defs[-1].scope == "module" for defs in info.name2fixturedefs.values())


# Unit items over their time budget (tests/unit/conftest.py marks them on their reports): listed
# at the end of the run, here because the xdist controller loads this conftest, not that one.
_over_budget: list[tuple[str, float]] = []


def pytest_runtest_logreport(report):
    for name, value in getattr(report, "user_properties", ()):
        if name == "unit_cost_s" and report.when == "call":
            _over_budget.append((report.nodeid, value))


def pytest_terminal_summary(terminalreporter):
    if not _over_budget:
        return
    terminalreporter.section("unit items over their time budget (PARAMSHARD_UNIT_LIMIT_S; not a failure)")
    for nodeid, cost in sorted(_over_budget, key=lambda entry: -entry[1]):
        terminalreporter.write_line(f"{cost:6.2f} s  {nodeid}")
    terminalreporter.write_line("make each faster, move it to tests/integration, or mark it "
                                "@pytest.mark.slow_unit(reason=...)")


# ``python -c`` of a server under an address-space limit (RLIMIT_AS, as ``ulimit -v`` sets it),
# given as argv[1] in bytes: set before paramshard is imported, as a shell's ulimit would be.
_UNDER_LIMIT = ("import resource, runpy, sys; limit = int(sys.argv.pop(1)); "
                "resource.setrlimit(resource.RLIMIT_AS, (limit, limit)); sys.argv[0] = 'paramshard'; "
                "runpy.run_module('paramshard', run_name='__main__', alter_sys=True)")


def server_argv(address_space: int | None = None) -> list[str]:
    """``paramshard server``, under an address-space limit of ``address_space`` bytes when given."""
    if address_space is None:
        return [sys.executable, "-m", "paramshard", "server"]
    return [sys.executable, "-c", _UNDER_LIMIT, str(address_space), "server"]


class Cluster:
    """Servers on free loopback ports, as threads of the test process or as processes; trainers
    are made by the test. ``address_space``: each server's RLIMIT_AS in bytes (None: the test
    process's own; a limit needs a process of its own). ``in_process``: None for the suite's
    choice (``servers_as_threads``)."""

    def __init__(self, servers: int, trainers: int, mode: str, timeout: float, address_space: int | None = None,
                 in_process: bool | None = None, **env_fields):
        addresses = [f"127.0.0.1:{p}" for p in free_ports(servers)]
        self.base = ClusterEnv(role=None, servers=tuple(addresses), num_trainers=trainers, mode=mode,
                               timeout=timeout, **env_fields)
        if in_process is None:
            in_process = servers_as_threads() and address_space is None
        self.children, self.threads = [], []
        for i in range(servers):
            env = dataclasses.replace(self.base, role="server", server_id=i)
            if in_process:
                # Real sockets on loopback, served by a thread of this process: no process start
                # (1-2 s of CPU each), the same wire and the same server (`make check`).
                self.threads.append(build_server(env).start())
            else:
                self.children.append(Child(f"server {i}", server_argv(address_space),
                                           child_environ(env)))

    def trainer_env(self, trainer_id: int, **overrides) -> ClusterEnv:
        return dataclasses.replace(self.base, role="trainer", trainer_id=trainer_id, **overrides)

    def close(self):
        stop_all(self.children, grace=3)       # together: one grace period, not one per server
        for server in self.threads:
            server.close()


def servers_as_threads(marked_processes: bool = False) -> bool:
    """The suite's servers are threads of the test process (the same wire and the same server,
    without a process start of 1-2 s of CPU each), under `make check` and `make test` alike. A
    test that kills or signals a server is marked ``processes`` and gets server processes; so
    does every test under PARAMSHARD_TEST_SERVERS=processes (to run the suite as it ran before).
    PARAMSHARD_TEST_SERVERS=threads is the default, spelt out (`make check`)."""
    choice = os.environ.get("PARAMSHARD_TEST_SERVERS", "threads")
    if choice not in ("threads", "processes"):
        raise pytest.UsageError(f"PARAMSHARD_TEST_SERVERS={choice!r}: expected threads or processes")
    return choice == "threads" and not marked_processes


@pytest.fixture
def cluster(request):
    made = []
    threads = servers_as_threads(request.node.get_closest_marker("processes") is not None)

    def make(servers=2, trainers=1, mode="sync", timeout=20.0, address_space=None, in_process=None, **env_fields):
        if in_process is None:
            in_process = threads and address_space is None
        c = Cluster(servers, trainers, mode, timeout, address_space, in_process, **env_fields)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def run_in_threads(fns, timeout=60.0):
    """Run callables concurrently; re-raise the first exception; fail on a hang."""
    results, errors = [None] * len(fns), []

    def wrap(i, fn):
        try:
            results[i] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)

    threads = [threading.Thread(target=wrap, args=(i, fn), daemon=True) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        if t.is_alive():
            raise AssertionError(f"a trainer thread did not finish within {timeout} s")
    if errors:
        raise errors[0]
    return results
