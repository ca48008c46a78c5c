"""build_launcher (launch/supervision/build.py): a Launcher is a composition made in one place, never
subclassed, and nothing is attached to it afterwards. Fake placements and engines: no process starts."""
import dataclasses
import importlib
import io
import pkgutil

import pytest

from paramshard.errors import ConfigError
from paramshard.launch.api import JobSpec, LaunchConfig, RankSpec
from paramshard.launch.elastic.job_control import JobControl
from paramshard.launch.engines.local import LocalEngine, LocalLauncher, LocalPlacement
from paramshard.launch.supervision.build import build_launcher
from paramshard.launch.supervision.launcher import Launcher
from paramshard.launch.supervision.listeners import JobListeners
from paramshard.launch.supervision.restart_policy import RestartPolicy


def config(**kw):
    return LaunchConfig(**{"module": "pkg.train", "servers": 2, "trainers": 2, **kw})


class Rank:
    def __init__(self, tag):
        self.tag, self.code = tag, None

    def poll(self):
        return self.code


class Engine:
    def __init__(self, out, tap_for):
        self.out, self.tap_for, self.started = out, tap_for, []

    def start(self, rank):
        self.started.append(rank)
        return Rank(rank.name)

    def stop(self, processes, grace, hurry):
        for p in processes:
            p.code = -15

    def ask_to_leave(self, p):
        pass


class Placement:
    """Two servers and two trainers on made-up hosts; records what the launcher asked."""

    def __init__(self, cfg, on_hosts):
        self.config, self.on_hosts = cfg, on_hosts
        self.engines, self.placed = [], []

    def engine(self, out, tap_for):
        self.engines.append(Engine(out, tap_for))
        return self.engines[-1]

    def job_spec(self, running, record):
        self.running = running
        base = self.config.base_env(["10.0.0.1:1", "10.0.0.2:1"])
        return JobSpec(tuple(RankSpec(f"server {i}", dataclasses.replace(base, role="server", server_id=i), ("x",),
                                      f"h{i}") for i in range(2)),
                       tuple(RankSpec(f"trainer {i}", dataclasses.replace(base, role="trainer", trainer_id=i),
                                      ("x",), f"h{i}") for i in range(2)))

    def describe(self, spec):
        return "started"

    def new_server_address(self, host=None):
        return f"{host or '10.0.0.3'}:1"

    def place_rank(self, rank):
        self.placed.append(rank.name)
        return dataclasses.replace(rank, host="h9")

    def add_host(self, text):
        return f"added {text}"

    def find(self, text):
        raise ConfigError(f"no host {text}")

    def remove_host(self, host):
        pass


def test_the_builder_composes_the_launcher_from_the_config_and_what_it_is_handed(tmp_path):
    out, tap = io.StringIO(), (lambda rank: None)
    told = []
    listeners = JobListeners(events=(lambda *a, **f: told.append(a),))
    policy = RestartPolicy(3)
    placement = Placement(config(min_trainers=1, max_restarts=1, checkpoint_dir=str(tmp_path)), on_hosts=True)
    launcher = build_launcher(placement.config, placement, policy=policy, out=out, tap_for=tap,
                              listeners=listeners, control_dir=tmp_path)
    (engine,) = placement.engines
    assert (engine.out, engine.tap_for) == (out, tap)
    assert launcher.policy is policy and launcher.config is placement.config
    with launcher:                                  # start(): the placement's spec, through the engine
        assert isinstance(launcher, JobControl)     # the port the elastic controllers use, whole
        assert [r.name for r in engine.started] == ["server 0", "server 1", "trainer 0", "trainer 1"]
        assert launcher.addresses == ["10.0.0.1:1", "10.0.0.2:1"] and launcher.elastic is not None
        assert [r.name for r in placement.running()] == ["server 0", "server 1", "trainer 0", "trainer 1"]
        # A rank started mid-job goes where the placement puts it; events reach the listeners.
        launcher.start_trainer(1, launcher.spec.trainers[1])
        assert placement.placed == ["trainer 1"] and engine.started[-1].host == "h9"
        launcher.record("replica", "a copy")
        assert told == [("replica", "a copy")]
        # A job on hosts takes `scale --add-host` and `--servers N --on HOST` through its channel.
        channel = launcher._control
        assert {"trainers", "servers", "remove_host", "add_host"} <= set(channel.handlers)
        assert "servers" in channel.takes_host
    assert all(p.poll() is not None for p in launcher.servers + launcher.trainers)


def test_a_job_on_this_machine_takes_no_host_requests_and_its_policy_comes_from_the_config(tmp_path):
    placement = Placement(config(max_restarts=2, checkpoint_dir=str(tmp_path)), on_hosts=False)
    launcher = build_launcher(placement.config, placement, control_dir=tmp_path)
    assert launcher.policy.max_restarts == 2 and launcher.elastic is None
    launcher.start()
    try:
        channel = launcher._control
        assert "add_host" not in channel.handlers and "servers" not in channel.takes_host
        with pytest.raises(ConfigError, match="--remove-host h1: this job was not launched over SSH"):
            launcher._remove_host("h1")
    finally:
        launcher.close()


def test_by_default_the_ranks_run_here_each_server_on_a_free_port():
    launcher = build_launcher(config(), out=io.StringIO())
    assert isinstance(launcher, Launcher) and launcher.starts_servers
    placement = LocalPlacement(config())
    spec = placement.job_spec(lambda: [], lambda *a, **f: None)
    addresses = spec.servers[0].env.servers
    assert len(set(addresses)) == 2 and all(a.startswith("127.0.0.1:") for a in addresses)
    assert placement.describe(spec).startswith(f"started 2 servers ({','.join(addresses)}) and 2 trainers")
    assert isinstance(placement.engine(None, None), LocalEngine)
    assert isinstance(LocalLauncher(config()), Launcher)        # the name users know builds one too


def test_nothing_outside_a_launcher_sets_its_state():
    """Issue 31: what a Launcher holds is read through properties; listeners, the run directory and
    the budget are handed to build_launcher. No public attribute can be assigned."""
    launcher = Launcher(Engine(None, None))
    launcher.start_job(Placement(config(), on_hosts=False).job_spec(lambda: [], None))
    public = [name for name in dir(launcher) if not name.startswith("_")
              and not callable(getattr(launcher, name))]
    assert {"servers", "trainers", "spec", "policy", "config", "addresses", "stopped_by_signal"} <= set(public)
    for name in public:
        with pytest.raises(AttributeError):
            setattr(launcher, name, getattr(launcher, name))


def test_no_module_of_paramshard_launch_subclasses_the_launcher():
    import paramshard.launch as launch
    for info in pkgutil.walk_packages(launch.__path__, "paramshard.launch."):
        importlib.import_module(info.name)
    assert Launcher.__subclasses__() == []


def test_an_ssh_job_refuses_fork_before_anything_is_probed():
    from paramshard.launch.engines.hosts import parse_hosts
    from paramshard.launch.engines.ssh import SshHosts, SshOptions
    with pytest.raises(ConfigError, match="drop --fork"):
        SshHosts(config(fork=True, check_script=False), parse_hosts("h1"), SshOptions())
