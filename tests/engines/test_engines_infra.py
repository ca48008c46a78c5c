"""The SSH-engine test infrastructure itself: real sshd hosts, rsync over them, and network
namespaces with partitions. Skips (saying why and how to install) without root, sshd, rsync
or iproute2; see scripts/install-test-engines.sh."""

import errno
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.engines import REQUIRE_ENV, alive, start_time
from tests.engines import mpi as mpi_mod
from tests.engines import netns as netns_mod
from tests.engines import slurm as slurm_mod
from tests.engines import sshd as sshd_mod
from tests.engines.mpi import mpi, mpirun_argv  # noqa: F401 - fixture
from tests.engines.netns import NetnsLab, cleanup_stale, netns_lab  # noqa: F401 - fixture
from tests.engines.slurm import SlurmCluster, slurm_cluster  # noqa: F401 - fixture
from tests.engines.sshd import SshHosts, ssh_hosts  # noqa: F401 - fixture

REPO = Path(__file__).resolve().parents[2]


def run(argv, timeout=30, **kw):
    return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, **kw)


def comm(pid):
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def netns_names():
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def root_routes():
    return subprocess.run(["ip", "route", "show"], capture_output=True, text=True).stdout


# -- skipping ---------------------------------------------------------------------------------

def test_skip_message_names_the_reason_and_the_installer(monkeypatch):
    monkeypatch.setattr(sshd_mod, "_checked", {})
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception) as skipped:
        sshd_mod.require_engines()
    assert "root" in str(skipped.value) and "scripts/install-test-engines.sh" in str(skipped.value)
    monkeypatch.setattr(sshd_mod, "_checked", {})
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="install-test-engines.sh"):
        sshd_mod.require_engines()


# -- sshd hosts on loopback aliases -------------------------------------------------------------

def test_two_sshd_hosts_accept_logins(ssh_hosts):
    hosts = ssh_hosts()
    assert hosts.hosts == ["host0", "host1"] and Path(hosts.ssh_config).is_file()
    for i, name in enumerate(hosts.hosts):
        r = run([*hosts.ssh, name, 'echo "$SSH_CONNECTION"; hostname -I; id -un'])
        assert r.returncode == 0, r.stderr
        connection, addresses, user = r.stdout.splitlines()
        # client-ip client-port server-ip server-port: the login reached this host's sshd
        assert connection.split()[2:] == [hosts.addresses[i], str(hosts.ports[i])]
        assert addresses.strip() and user == "root"
    # The address works as a host name too (the Host entry matches both).
    r = run([*hosts.ssh, hosts.addresses[1], 'echo "$SSH_CONNECTION"'])
    assert r.returncode == 0 and r.stdout.split()[2] == hosts.addresses[1], r.stderr

    # One host can be stopped alone, with its running sessions; the other goes on.
    session = subprocess.Popen([*hosts.ssh, hosts.hosts[1], "sleep 60"], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until the session runs: listener > session > sleep
            tree = sshd_mod.process_tree(hosts.pid(1))
            if any(comm(pid) == "sleep" for pid, _ in tree):
                break
            time.sleep(0.05)
        assert any(comm(pid) == "sleep" for pid, _ in tree), tree
        hosts.stop_host(1)
        assert session.wait(timeout=10) == 255  # the session died with its host
    finally:
        if session.poll() is None:
            session.kill()
            session.wait()
    assert all(start_time(pid) != st for pid, st in tree)  # gone, reaped: no zombie left
    assert hosts.pid(1) is None
    r = run([*hosts.ssh, hosts.hosts[1], "true"])
    assert r.returncode == 255 and "refused" in r.stderr
    assert run([*hosts.ssh, hosts.hosts[0], "true"]).returncode == 0
    hosts.restart_host(1)
    assert run([*hosts.ssh, hosts.hosts[1], "true"]).returncode == 0


def test_close_stops_every_sshd():
    sshd_mod.require_engines()
    with SshHosts() as hosts:
        pids = [(hosts.pid(i), start_time(hosts.pid(i))) for i in range(2)]
        workdir = hosts.workdir
        assert all(st is not None for _, st in pids)
    assert not any(alive(pid, st) for pid, st in pids)
    assert not workdir.exists()


def test_a_host_that_cannot_start_is_named_with_its_log(tmp_path):
    sshd_mod.require_engines()
    with socket.socket() as taken:
        taken.bind(("127.0.0.3", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(sshd_mod.SshStartError) as failed:
            SshHosts(port=port, workdir=tmp_path, start_timeout=5)
    message = str(failed.value)
    assert "host1 (127.0.0.3:%d)" % port in message and "Address already in use" in message
    assert not any(f"sshd{i}_config" in line for line in run(["ps", "-eo", "args"]).stdout.splitlines()
                   for i in range(2) if str(tmp_path) in line)  # host0's sshd was stopped too


def test_rsync_copies_a_tree_then_transfers_nothing(ssh_hosts, tmp_path):
    hosts = ssh_hosts()
    src = tmp_path / "src"
    (src / "pkg" / "sub").mkdir(parents=True)
    (src / "train.py").write_text("print('hi')\n")
    (src / "pkg" / "__init__.py").write_text("")
    (src / "pkg" / "sub" / "data.bin").write_bytes(os.urandom(50_000))
    (src / "stale.txt").write_text("removed later\n")
    dst = tmp_path / "remote" / "deep" / "workspace"  # does not exist: --mkpath makes it

    def rsync(*extra):
        r = run(["rsync", "-az", "--delete", "--mkpath", *extra, "-e", hosts.rsync_rsh,
                 f"{src}/", f"{hosts.hosts[0]}:{dst}/"])
        assert r.returncode == 0, r.stderr
        return r.stdout

    rsync()
    assert (dst / "pkg" / "sub" / "data.bin").read_bytes() == (src / "pkg" / "sub" / "data.bin").read_bytes()
    assert (dst / "stale.txt").exists()
    assert "Number of regular files transferred: 0" in rsync("--stats")
    (src / "stale.txt").unlink()
    (src / "train.py").write_text("print('changed')\n")
    stats = rsync("--stats")
    assert "Number of regular files transferred: 1" in stats
    assert not (dst / "stale.txt").exists() and (dst / "train.py").read_text() == "print('changed')\n"


# -- network namespaces ---------------------------------------------------------------------

LISTENER = textwrap.dedent("""
    import socket, sys
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], 7777))
    s.listen(1)
    print("ready", flush=True)
    s.settimeout(20)
    c, peer = s.accept()
    c.sendall(("hello " + peer[0]).encode())
    c.close()
""")
CLIENT = textwrap.dedent("""
    import socket, sys
    with socket.create_connection((sys.argv[1], 7777), timeout=5) as c:
        print(c.recv(100).decode())
""")


def test_netns_lab_tcp_between_namespaces_and_root_is_cut_off(netns_lab):
    lab = netns_lab(2)
    assert lab.addresses == ["10.213.7.10", "10.213.7.11"]
    listener = lab.run(1, [sys.executable, "-c", LISTENER, lab.addresses[1]], stdout=subprocess.PIPE, text=True)
    assert listener.stdout.readline().strip() == "ready"
    r = lab.check_call(0, [sys.executable, "-c", CLIENT, lab.addresses[1]])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"hello {lab.addresses[0]}"
    assert listener.wait(timeout=10) == 0

    # The root namespace routes the lab's subnet nowhere. Check the route first, so that the
    # connect below can never leave the machine, then see the connect fail at once.
    route = run(["ip", "route", "get", lab.addresses[0]])
    assert route.returncode != 0 and "No route to host" in route.stderr, route
    assert f"unreachable {lab.subnet} metric {lab.route_metric}" in root_routes()
    t0 = time.monotonic()
    with socket.socket() as s, pytest.raises(OSError) as failed:
        s.settimeout(2)
        s.connect((lab.addresses[0], 7777))
    assert failed.value.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH)
    assert time.monotonic() - t0 < 0.5


def test_ssh_across_namespaces_partition_and_cleanup(netns_lab, ssh_hosts):
    lab = netns_lab(3)
    hosts = ssh_hosts(lab.addresses, netns=lab.namespaces)
    sshd_pids = [(hosts.pid(i), start_time(hosts.pid(i))) for i in range(3)]
    for i, (pid, _) in enumerate(sshd_pids):  # each sshd runs in its host's namespace
        assert run(["ip", "netns", "identify", str(pid)]).stdout.strip() == lab.namespaces[i]

    def ssh_from0(i, command="true", timeout=2):
        return lab.check_call(0, [*hosts.ssh, "-o", f"ConnectTimeout={timeout}", hosts.hosts[i], command])

    r = ssh_from0(1, 'hostname -I; echo "$SSH_CONNECTION"')
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == lab.addresses[1]
    assert r.stdout.split()[1:] == [lab.addresses[0], r.stdout.split()[2], lab.addresses[1], "2222"]

    lab.cut(1)
    t0 = time.monotonic()
    r = ssh_from0(1)
    elapsed = time.monotonic() - t0
    assert r.returncode == 255 and "timed out" in r.stderr, r.stderr
    assert elapsed >= 1.5  # silent: no refusal, no unreachable error, just nothing
    assert ssh_from0(2).returncode == 0  # the rest of the network is fine
    lab.restore(1)
    assert ssh_from0(1, timeout=5).returncode == 0

    tag = lab.tag
    hosts.close()
    lab.close()
    assert not any(alive(pid, st) for pid, st in sshd_pids)
    assert tag not in netns_names()
    assert f"metric {lab.route_metric}" not in root_routes() and lab.route_metric is None
    assert not (netns_mod.STATE_DIR / f"{tag}.json").exists()


def test_stale_lab_of_a_killed_process_is_cleaned_up():
    netns_mod.require_netns()
    code = ("from tests.engines.netns import NetnsLab; import time\n"
            "lab = NetnsLab(2, '10.213.8.0/24')\n"
            "print(lab.tag, lab.route_metric, flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        tag, metric = proc.stdout.readline().split()
        assert f"pshd-{tag}-h1" in netns_names() and f"metric {metric}" in root_routes()
    finally:
        proc.kill()  # SIGKILL: no cleanup of its own
        proc.wait()
    cleanup_stale()  # (a parallel run's NetnsLab may have cleaned it up already: same result)
    assert tag not in netns_names() and f"metric {metric}" not in root_routes()
    assert not (netns_mod.STATE_DIR / f"{tag}.json").exists()


def test_sshd_dies_with_the_process_that_started_it(tmp_path):
    sshd_mod.require_engines()
    if sshd_mod.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is missing")
    code = ("from tests.engines.sshd import SshHosts; import time\n"
            f"h = SshHosts(workdir={str(tmp_path)!r})\n"
            "print(h.pid(0), h.pid(1), flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        started = [(pid, start_time(pid)) for pid in pids]
        assert len(started) == 2 and all(alive(pid, st) for pid, st in started)
    finally:
        proc.kill()  # SIGKILL: no close()
        proc.wait()
    deadline = time.monotonic() + 5
    while any(alive(pid, st) for pid, st in started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid, st) for pid, st in started)


# -- Open MPI (mpirun + mpi4py) --------------------------------------------------------------

def test_mpi_and_slurm_skip_messages_name_the_package_and_the_installer(monkeypatch):
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    monkeypatch.setattr(mpi_mod, "_checked", [])
    monkeypatch.setattr(mpi_mod.shutil, "which", lambda *a, **k: None)
    with pytest.raises(pytest.skip.Exception) as skipped:
        mpi_mod.require_mpi()
    assert "openmpi-bin" in str(skipped.value) and "scripts/install-test-engines.sh" in str(skipped.value)
    monkeypatch.setattr(slurm_mod, "_checked", [])
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(pytest.skip.Exception) as skipped:
        slurm_mod.require_slurm()
    assert "root" in str(skipped.value) and "slurm-wlm" in str(skipped.value)
    assert "scripts/install-test-engines.sh" in str(skipped.value)
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="install-test-engines.sh"):
        slurm_mod.require_slurm()
    monkeypatch.setattr(mpi_mod, "_checked", [])
    with pytest.raises(pytest.fail.Exception, match="openmpi-bin"):
        mpi_mod.require_mpi()


ALLGATHER = textwrap.dedent("""
    import json, os
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    # Over ssh a rank inherits its orted's SSH_CONNECTION: "client port SERVER port".
    host = os.environ["SSH_CONNECTION"].split()[2] if "SSH_CONNECTION" in os.environ else "local"
    ids = (int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"]))
    assert ids == (comm.Get_rank(), comm.Get_size()), ids
    gathered = comm.allgather([comm.Get_rank(), host, os.environ.get("PARAMSHARD_PROBE")])  # (-x passes it)
    os.write(1, f"rank {comm.Get_rank()} gathered {json.dumps(gathered)}\\n".encode())  # one write: no interleaving
""")


def gathered_lines(stdout):
    lines = [line.split(" gathered ") for line in stdout.splitlines() if line.startswith("rank ")]
    return {int(rank.split()[1]): [tuple(x) for x in json.loads(g)] for rank, g in lines}


def test_mpirun_4_local_ranks_allgather(mpi, tmp_path, monkeypatch):
    monkeypatch.delenv("SSH_CONNECTION", raising=False)  # (local ranks inherit mpirun's environment)
    script = tmp_path / "allgather.py"
    script.write_text(ALLGATHER)
    r = run(mpirun_argv(4, sys.executable, str(script)), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    expected = [(i, "local", None) for i in range(4)]
    assert gathered_lines(r.stdout) == {i: expected for i in range(4)}, r.stdout


def test_mpirun_over_two_ssh_hosts_ranks_know_their_host(mpi, ssh_hosts, tmp_path):
    hosts = ssh_hosts()
    script = tmp_path / "allgather.py"
    script.write_text(ALLGATHER)
    argv = mpirun_argv(4, sys.executable, str(script), hosts=hosts, extra_env=["PARAMSHARD_PROBE=1"])
    assert "--hostfile" in argv and f"ssh -F {hosts.ssh_config}" in " ".join(argv)
    hostfile = Path(argv[argv.index("--hostfile") + 1])
    assert hostfile.read_text() == "127.0.0.2 slots=2\n127.0.0.3 slots=2\n"
    r = run(argv, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    # Slot by slot: ranks 0-1 on the first host, 2-3 on the second.
    expected = [(0, "127.0.0.2", "1"), (1, "127.0.0.2", "1"), (2, "127.0.0.3", "1"), (3, "127.0.0.3", "1")]
    assert gathered_lines(r.stdout) == {i: expected for i in range(4)}, r.stdout


# -- Slurm (munged + slurmctld + slurmd) ------------------------------------------------------

def test_slurm_cluster_runs_srun_with_4_tasks(slurm_cluster):
    cluster = slurm_cluster()
    assert cluster.node_state() == "idle"
    assert cluster.startup_seconds < 15
    r = cluster.run(cluster.srun_argv(4, "sh", "-c",
                                      'echo "$SLURM_PROCID $SLURM_NTASKS $SLURM_JOB_ID $SLURMD_NODENAME $SLURM_NODEID"'))
    assert r.returncode == 0, r.stderr
    rows = sorted(line.split() for line in r.stdout.splitlines())
    assert [row[0] for row in rows] == ["0", "1", "2", "3"], r.stdout
    assert {tuple(row[1:]) for row in rows} == {("4", rows[0][2], cluster.node_name, "0")}, r.stdout
    assert f"NodeAddr=127.0.0.1" in cluster.scontrol("show", "node", cluster.node_name).stdout
    # Every daemon listens on 127.0.0.1 only.
    listening = run(["ss", "-Hltnp"]).stdout.splitlines()
    for pid in cluster.pids().values():
        mine = [line for line in listening if f"pid={pid}," in line]
        assert all(line.split()[3].startswith("127.0.0.1:") for line in mine), mine


FAIL_ONE = textwrap.dedent("""
    import os, sys, time
    rank = int(os.environ["SLURM_PROCID"])
    print("started", rank, flush=True)
    time.sleep(0.5)
    if rank == 1:
        sys.exit(1)
    time.sleep(60)  # killed by Slurm: {marker}
""")


def test_srun_kill_on_bad_exit_ends_promptly(slurm_cluster, tmp_path):
    cluster = slurm_cluster()
    marker = f"paramshard-test-{os.getpid()}-{time.monotonic_ns()}"
    script = tmp_path / "fail_one.py"
    script.write_text(FAIL_ONE.format(marker=marker))
    t0 = time.monotonic()
    r = cluster.run(cluster.srun_argv(4, sys.executable, str(script), marker, extra=["--kill-on-bad-exit=1"]))
    elapsed = time.monotonic() - t0
    assert r.returncode != 0 and elapsed < 15, (r.returncode, elapsed, r.stderr)
    assert "task 1: Exited with exit code 1" in r.stderr, r.stderr
    deadline = time.monotonic() + 5  # the three sleeping tasks were killed too
    while time.monotonic() < deadline and marker in run(["ps", "-eo", "args"]).stdout:
        time.sleep(0.1)
    assert marker not in run(["ps", "-eo", "args"]).stdout


def test_slurm_close_stops_every_daemon_and_step(slurm_cluster):
    cluster = slurm_cluster(workdir=None)  # its own temporary directory, removed by close()
    job = subprocess.Popen(cluster.srun_argv(2, "sleep", "60"), env=cluster.environ(), stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def processes():
            steps = cluster.step_daemons()
            procs = [p for pid in cluster.pids().values() for p in sshd_mod.process_tree(pid)]  # (+ slurmscriptd)
            procs += [p for step in steps for p in sshd_mod.process_tree(step)]  # slurmstepd and its tasks
            return steps, procs

        # The step daemon appears before it has forked and exec'd its tasks (under load, seconds
        # before: seen in a run beside other jobs): wait for the tasks themselves.
        deadline = time.monotonic() + 30
        steps, procs = processes()
        while "sleep" not in {comm(pid) for pid, _ in procs} and time.monotonic() < deadline:
            time.sleep(0.05)
            steps, procs = processes()
        assert steps, cluster.logs()
        assert {comm(pid) for pid, _ in procs} >= {"munged", "slurmctld", "slurmd", "slurmstepd", "sleep"}
        workdir = cluster.workdir
        cluster.close()
        assert not any(alive(pid, st) for pid, st in procs)
        assert job.wait(timeout=10) != 0
        assert not workdir.exists()
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


def test_a_slurm_cluster_that_cannot_start_is_skipped_with_the_daemon_log(slurm_cluster, monkeypatch):
    slurm_mod.require_slurm()
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    started = []
    spawn = SlurmCluster._spawn

    def recording_spawn(self, name, argv):
        spawn(self, name, argv)
        started.append((self.procs[name].pid, start_time(self.procs[name].pid)))

    monkeypatch.setattr(SlurmCluster, "_spawn", recording_spawn)
    with pytest.raises(pytest.skip.Exception) as skipped:
        slurm_cluster(extra_conf="NoSuchSlurmOption=1", start_timeout=10)
    message = str(skipped.value)
    assert "slurmctld exited with code" in message and "NoSuchSlurmOption" in message, message
    assert "scripts/install-test-engines.sh" in message
    assert len(started) == 2 and not any(alive(pid, st) for pid, st in started)  # munged was stopped
