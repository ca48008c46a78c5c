"""Host lists, placement over hosts, and the remote command line (pure, no ssh)."""
import os
import re
import shlex
import subprocess

import pytest

from paramshard.env import ClusterEnv
from paramshard.errors import ConfigError
from paramshard.launch.api import RankSpec
from paramshard.launch.engines.hosts import Host, parse_host, parse_hosts, placement
from paramshard.launch.engines import ssh as ssh_module
from paramshard.launch.engines.ssh import SshOptions, remote_command, remote_dir


def test_host_entries():
    assert parse_host("10.0.0.1") == Host("10.0.0.1")
    assert parse_host("alice@node7:2222 slots=4") == Host("node7", "alice", 2222, 4)
    assert parse_host("[fe80::1]:22").address == "fe80::1"
    for bad in ("a@", "h:port", "h slots=0", "h gpus=2", "h:70000"):
        with pytest.raises(ConfigError):
            parse_host(bad)


def test_hosts_from_a_list_or_a_file(tmp_path):
    assert [h.host for h in parse_hosts("a, b ,c")] == ["a", "b", "c"]
    f = tmp_path / "hosts"
    f.write_text("# the cluster\nn1 slots=2\n\nroot@n2:2200  # spare\n")
    assert parse_hosts(str(f)) == [Host("n1", slots=2), Host("n2", "root", 2200)]
    with pytest.raises(ConfigError, match="twice"):
        parse_hosts("a,a")
    with pytest.raises(ConfigError, match="no host"):
        parse_hosts(" , ")


def test_servers_spread_first_then_trainers_fill_the_least_loaded_hosts():
    hosts = parse_hosts("a,b,c")
    servers, trainers = placement(2, 4, hosts)
    assert [h.host for h in servers] == ["a", "b"]
    assert [h.host for h in trainers] == ["c", "a", "b", "c"]


def test_pinned_hosts_and_slots():
    hosts = parse_hosts("a slots=1,b slots=2")
    servers, trainers = placement(1, 2, hosts, server_hosts=[hosts[1]])
    assert [h.host for h in servers] == ["b"] and [h.host for h in trainers] == ["a", "b"]
    with pytest.raises(ConfigError, match="no free slot for trainer 2"):
        placement(1, 3, hosts)


def test_remote_dir_keeps_the_tilde_for_the_remote_shell():
    assert remote_dir("~/.paramshard/job 1") == "~/'.paramshard/job 1'"
    assert remote_dir("/srv/x y") == "'/srv/x y'"


def test_the_remote_command_carries_the_environment_but_never_the_secret(tmp_path):
    env = ClusterEnv(role="trainer", servers=("10.0.0.1:5000",), trainer_id=0, secret="s3cret", job_id="j1")
    rank = RankSpec("trainer 0", env, ("/usr/bin/python3", "train.py", "--lr", "0.1 0.2"), host="n1")
    cmd = remote_command(rank, str(tmp_path), read_secret=True)
    assert "s3cret" not in cmd
    assert "PARAMSHARD_JOB_ID=j1" in cmd and "read-secret" in cmd
    argv = shlex.split(cmd)
    assert argv[:3] == ["cd", str(tmp_path), "&&"] and "setsid" in argv


def test_the_wrapper_runs_the_command_with_its_environment_and_exit_code(tmp_path):
    """Run the remote command line locally through sh, as sshd would."""
    env = ClusterEnv(role="trainer", servers=("127.0.0.1:5000",), trainer_id=0, secret="s3cret", job_id="j1")
    script = tmp_path / "show.py"
    script.write_text("import os, sys\nprint(os.environ['PARAMSHARD_SECRET'], os.environ['PARAMSHARD_JOB_ID'],"
                      " sys.argv[1])\nsys.exit(7)\n")
    import sys
    rank = RankSpec("trainer 0", env, (sys.executable, "show.py", "a b"))
    proc = subprocess.Popen(["sh", "-c", remote_command(rank, str(tmp_path), read_secret=True)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    proc.stdin.write("s3cret\n")
    proc.stdin.flush()                           # and keep it open, as the launcher does
    try:
        out = proc.stdout.read()
        assert out.split() == ["s3cret", "j1", "a", "b"] and proc.wait(20) == 7
    finally:
        proc.kill()
        proc.stdin.close()


def test_closing_stdin_kills_the_remote_process_group(tmp_path):
    """The no-orphans watcher: EOF on the channel's stdin ends everything the rank started."""
    import sys
    import time
    env = ClusterEnv(role="trainer", servers=("127.0.0.1:5000",), trainer_id=0)
    (tmp_path / "spawn.py").write_text(
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(p.pid, flush=True)\ntime.sleep(60)\n")
    rank = RankSpec("trainer 0", env, (sys.executable, "spawn.py"))
    proc = subprocess.Popen(["sh", "-c", remote_command(rank, str(tmp_path), read_secret=False)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(proc.stdout.readline())
        proc.stdin.close()                       # the ssh channel closed
        assert proc.wait(10) != 0
        deadline = time.monotonic() + 5
        while _alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(grandchild), "the rank's own child outlived the closed channel"
    finally:
        proc.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_ssh_options():
    argv = SshOptions(ssh_config="/x/cfg").ssh_argv(Host("n1", port=2222))
    assert argv[:2] == ["ssh", "-T"] and ["-F", "/x/cfg"] == argv[argv.index("-F"):argv.index("-F") + 2]
    assert "BatchMode=yes" in argv and "-p" in argv and "ServerAliveInterval=2" in argv


# -- hosts and users never reach ssh or rsync as options (issue 20, defect 9) ---------------------
@pytest.mark.parametrize("entry, message", [
    ("-oProxyCommand=touch/tmp/pwned", "host '-oProxyCommand=touch/tmp/pwned' starts with '-'"),
    ("-oProxyCommand=sh -c id", "host '-oProxyCommand=sh' starts with '-'"),
    ("-l@node7", "user '-l' starts with '-'"),
    ("alice@-oProxyCommand=x:22", "host '-oProxyCommand=x' starts with '-'"),
    ("node$(id)", "host 'node$(id)': a host name may hold only letters, digits"),
    ("a;b@node7", "user 'a;b': a user name may hold only"),
    ("`id`", "host '`id`'"),
])
def test_hosts_and_users_that_ssh_would_read_as_options_or_shell_are_refused(entry, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_host(entry)
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_hosts(f"n1,{entry}")


def test_a_host_made_directly_is_checked_too():
    with pytest.raises(ConfigError, match="starts with '-'"):
        Host("-oProxyCommand=x")
    with pytest.raises(ConfigError, match="user '-F' starts with '-'"):
        Host("n1", user="-F")
    assert Host("node-7.example.com", "first.last_1").target == "first.last_1@node-7.example.com"
    assert Host("[fe80::1]").address == "fe80::1"


def _after_options(argv: list[str]) -> list[str]:
    """The words ssh takes as its destination and command: those after the first "--"."""
    assert "--" in argv, argv
    return argv[argv.index("--") + 1:]


def test_ssh_and_rsync_read_no_option_after_the_destination_begins(monkeypatch, tmp_path):
    """`--` ends ssh's options before the target (ranks, probes), and rsync's before its operands."""
    host = Host("n1", "alice", 2222)
    options = SshOptions(ssh_config="/x/cfg", remote_python="/usr/bin/python3")
    seen: list[list[str]] = []

    def fake_run(argv, timeout, what):
        seen.append(argv)
        return "machine 4 5000\n" if argv[0] == "ssh" else "Number of regular files transferred: 2\n"
    monkeypatch.setattr(ssh_module, "_run", fake_run)
    ssh_module.probe(host, 1, options)
    ssh_module.dispatch(host, str(tmp_path), "~/ws", options)
    monkeypatch.setattr(ssh_module, "RemoteChild", lambda host, tag, argv, *a, **k: argv)
    env = ClusterEnv(role="trainer", servers=("10.0.0.1:5000",), trainer_id=0, job_id="j1")
    engine = ssh_module.SshEngine({"n1": host}, options, "/w", secret=None)
    rank_argv = engine.start(RankSpec("trainer 0", env, ("/usr/bin/python3", "train.py"), host="n1"))
    probe_argv, rsync_argv = seen
    for argv in (probe_argv, rank_argv):
        assert argv[:argv.index("--")] == options.ssh_argv(host)
        assert _after_options(argv)[0] == "alice@n1" and len(_after_options(argv)) == 2
    assert rsync_argv[0] == "rsync" and _after_options(rsync_argv) == [os.path.join(str(tmp_path), ""),
                                                                      "alice@n1:~/ws/"]
