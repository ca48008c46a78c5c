"""`paramshard launch` as a user types it."""
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.e2e.in_process import cli_in_process

SCRIPT = textwrap.dedent("""
    import os, sys
    import torch, torch.nn as nn
    import paramshard as ps
    env = ps.init()
    torch.manual_seed(0)
    model = nn.Linear(32, 300)
    trainer = ps.Trainer(model, ps.optim.SGD(lr=0.1))
    for step in range(3):
        trainer.step(model(torch.ones(4, 32)).pow(2).mean())
    if env.trainer_id == 0:
        print("servers hold", sum(s["dense_elements"] for s in trainer.server_stats()))
    print("paddle-compatible env:", env.num_trainers, env.mode, len(env.servers))
    trainer.close()
    if os.environ.get("FAIL_TRAINER") == str(env.trainer_id):
        sys.exit(3)
""")


def launch(tmp_path, *flags, env_extra=None, timeout=120):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    import os
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "paramshard", "launch", *flags, str(script)],
                          capture_output=True, text=True, timeout=timeout, env=env)


def test_launch_runs_servers_and_trainers_with_tagged_logs(tmp_path):
    r = launch(tmp_path, "--servers", "2", "--trainers", "2", "--min-block-size", "1024")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "trainer 0 | servers hold 9900" in r.stdout     # 32*300 + 300 elements
    assert "trainer 1 | paddle-compatible env: 2 sync 2" in r.stdout
    assert "server 1 |" in r.stdout


def test_failed_trainer_stops_the_job_and_is_named(tmp_path):
    start = time.monotonic()
    r = launch(tmp_path, "--servers", "1", "--trainers", "2", "--mode", "async",
               env_extra={"FAIL_TRAINER": "1"})
    assert r.returncode != 0
    assert "trainer 1" in r.stderr and "exited with code 3" in r.stderr
    assert time.monotonic() - start < 60


@pytest.mark.parametrize("flags,message", [
    (["--servers", "0"], "at least one server"),
    (["--trainers", "0"], "at least one trainer"),
    (["--mode", "fast"], "invalid choice: 'fast'"),
    (["--dispatch", "random"], "invalid choice: 'random'"),
    (["--timeout", "-1"], "must be > 0"),
])
def test_bad_flags_get_a_clear_message(tmp_path, capsys, flags, message):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    code, _, err = cli_in_process(capsys, "launch", *flags, script)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_missing_script_is_reported(tmp_path):
    r = subprocess.run([sys.executable, "-m", "paramshard", "launch", str(tmp_path / "nope.py")],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "not found" in r.stderr and "Traceback" not in r.stderr


def test_server_command_without_environment_explains(tmp_path):
    import os
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PARAMSHARD_", "PADDLE_"))}
    r = subprocess.run([sys.executable, "-m", "paramshard", "server"], capture_output=True, text=True,
                       timeout=30, env=env)
    assert r.returncode == 2 and "PARAMSHARD_ROLE must be 'server'" in r.stderr


def test_standalone_script_starts_its_own_server(tmp_path):
    import os
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PARAMSHARD_", "PADDLE_"))}
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert "servers hold 9900" in r.stdout


def test_ctrl_c_stops_every_process_of_the_job(tmp_path):
    import os
    import signal
    script = tmp_path / "slow.py"
    pids = tmp_path / "pids"
    script.write_text(textwrap.dedent(f"""
        import os, time
        import paramshard as ps
        ps.init()
        with open({str(pids)!r}, "a") as f:
            f.write(str(os.getpid()) + "\\n")
        time.sleep(120)
    """))
    proc = subprocess.Popen([sys.executable, "-m", "paramshard", "launch", "--trainers", "2", str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while (not pids.exists() or len(pids.read_text().split()) < 2) and time.monotonic() < deadline:
            time.sleep(0.2)
        children = [int(p) for p in pids.read_text().split()]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    for pid in children:
        try:
            os.kill(pid, 0)
            alive = True
        except ProcessLookupError:
            alive = False
        assert not alive, f"trainer pid {pid} survived Ctrl-C"


def test_one_script_runs_every_rank_under_openmpi_variables(tmp_path):
    """mpirun starts the same script on every rank; the first S ranks serve."""
    import os
    from paramshard.launch.engines.ports import free_ports
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    port = free_ports(1)[0]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PARAMSHARD_", "PADDLE_", "OMPI_"))}
    base.update({"PARAMSHARD_SERVERS": f"127.0.0.1:{port}", "OMPI_COMM_WORLD_SIZE": "2"})
    ranks = [subprocess.Popen([sys.executable, str(script)], env={**base, "OMPI_COMM_WORLD_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    try:
        outs = [r.communicate(timeout=90) for r in ranks]
    finally:
        for r in ranks:
            if r.poll() is None:
                r.kill()
    assert [r.returncode for r in ranks] == [0, 0], outs
    assert "servers hold 9900" in outs[1][0]          # rank 1 trained; rank 0 served and exited
    assert "server 0 serving" in outs[0][1]


def test_launcher_api_waits_for_its_servers_and_cleans_up(tmp_path):
    from paramshard.launch.engines.local import LaunchConfig, LocalLauncher
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    import io
    out = io.StringIO()
    with LocalLauncher(LaunchConfig(script=str(script), servers=2, trainers=1), out=out) as launcher:
        launcher.wait_ready(timeout=30)          # both servers answer before any trainer work
        assert launcher.wait() == 0
    assert all(c.poll() is not None for c in launcher.servers + launcher.trainers)
    assert "trainer 0 | servers hold 9900" in out.getvalue()


PROBE = Path(__file__).parent / "scripts" / "secure_probe.py"


def _probe_job(tmp_path, *flags, env_extra=None):
    import os
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARAMSHARD_")}
    return subprocess.run([sys.executable, "-m", "paramshard", "launch", "--run-dir", str(tmp_path / "run"), *flags,
                           str(PROBE)], capture_output=True, text=True, timeout=120, env={**env, **(env_extra or {})})


def test_a_launch_without_a_secret_is_encrypted_and_refuses_plain_clients(tmp_path):
    import hashlib
    import json
    import re
    import stat
    r = _probe_job(tmp_path, "--servers", "2", "--trainers", "2")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    digests = set(re.findall(r"trainer \d secret (\S+)", r.stdout))
    assert len(digests) == 1 and "None" not in digests, r.stdout      # one secret, every rank has it
    assert r.stdout.count("plain client refused") == 2, r.stdout
    assert "refused the connection handshake" in r.stdout and "this process uses no secret: plain TCP" in r.stdout
    assert "plain client served" not in r.stdout and len(re.findall(r"trainer \d trained", r.stdout)) == 2
    # `paramshard stats RUN_DIR` reads it; only this user can; config.json does not hold it.
    secret_file = tmp_path / "run" / "secret"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    secret = secret_file.read_text().strip()
    assert {hashlib.sha256(secret.encode()).hexdigest()[:16]} == digests
    assert secret not in (tmp_path / "run" / "config.json").read_text()
    assert json.loads((tmp_path / "run" / "config.json").read_text())["launch"]["insecure"] is False


@pytest.mark.parametrize("how", ["--insecure", "PARAMSHARD_INSECURE=1"])
def test_insecure_launch_runs_plain_tcp(tmp_path, how):
    flags, extra = (["--insecure"], None) if how == "--insecure" else ([], {"PARAMSHARD_INSECURE": "1"})
    r = _probe_job(tmp_path, *flags, env_extra=extra)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "trainer 0 secret None" in r.stdout and "trainer 0 plain client served" in r.stdout, r.stdout
    assert "connections are plain TCP" in r.stderr
    assert not (tmp_path / "run" / "secret").exists()


def test_insecure_with_a_secret_is_refused_naming_both(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PARAMSHARD_SECRET", "mine")
    code, _, err = cli_in_process(capsys, "launch", "--run-dir", tmp_path / "run", "--insecure", PROBE)
    assert code == 2 and "Traceback" not in err
    assert "PARAMSHARD_INSECURE=1 (--insecure) asks for plain TCP, but PARAMSHARD_SECRET is set too" in err
    assert not (tmp_path / "run").exists()          # refused before any effect
