"""`paramshard scale RUN_DIR --remove-host HOST` on a running async SSH job over two real sshd hosts
(loopback aliases, tests/engines/sshd.py): servers 0, 2 and trainer 0 run on the first host, servers 1,
3 and trainer 1 on the second. Removing the second moves the partitions and blocks of exactly servers
1 and 3 (not the highest two) to servers 0 and 2, trainer 1 leaves at its step boundary, servers 1
and 3 exit while the job trains (nothing of the job is left on that host), a later `scale --trainers
2` starts trainer 1 on the first host, and the job ends 0 with every record trained once and applied
once by the servers (scripts/matrix_job.py's exact-sum oracle). Removing the first host (server 0)
is refused first, with its reason, and changes nothing."""
import os
import re
import subprocess
import sys
import time

import pytest

from tests.engines import alive, process_tree
from tests.engines.sshd import SshHosts, require_engines

from tests.e2e.run_job import REPO
from tests.e2e.test_elastic_matrix import ROWS, check_oracles
from tests.e2e.test_ssh_scale import Output, events, wait_for_event

SCRIPT = REPO / "tests" / "e2e" / "scripts" / "matrix_job.py"
ENV = {**os.environ, "PYTHONPATH": str(REPO / "src")}      # the paramshard under test, not an installed one


def scale(run_dir, *flags, ok=True) -> str:
    done = subprocess.run([sys.executable, "-m", "paramshard", "scale", str(run_dir), *flags, "--wait", "40"],
                          capture_output=True, text=True, timeout=90, cwd=REPO, env=ENV)
    assert (done.returncode == 0) == ok, done.stdout + done.stderr
    return done.stdout + done.stderr


def ranks_on(hosts: SshHosts, i: int) -> list[int]:
    """Living processes of our ranks under host ``i``'s sshd (not sshd's own)."""
    out = []
    for p, start in process_tree(hosts.pid(i)) if hosts.pid(i) else []:
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                command = f.read().split(b"\0")[0]
        except OSError:
            continue
        if b"sshd" not in command and alive(p, start):
            out.append(p)
    return out


def wait_until_none(hosts, indices, job, deadline=20.0) -> None:
    end = time.monotonic() + deadline
    while any(ranks_on(hosts, i) for i in indices) and time.monotonic() < end:
        time.sleep(0.2)
    left = {i: ranks_on(hosts, i) for i in indices}
    assert not any(left.values()), f"processes left on hosts {left}:\n{job.text()[-4000:]}"


@pytest.mark.timeout(240)
def test_removing_a_host_moves_its_servers_ids_away_and_its_trainers_out_and_sums_hold(tmp_path):
    require_engines()
    # The remote ranks import the paramshard under test (PYTHONPATH does not cross ssh).
    shim = tmp_path / "python.sh"
    shim.write_text(f"#!/bin/sh\nPYTHONPATH={REPO / 'src'} exec {sys.executable} \"$@\"\n")
    shim.chmod(0o755)
    data, logs, hold, run_dir = tmp_path / "d.svm", tmp_path / "ids", tmp_path / "hold", tmp_path / "run"
    data.write_text("".join(f"{i % 2} {i}:1\n" for i in range(ROWS)))
    logs.mkdir()
    hold.touch()        # the trainers pace themselves until the test is done scaling
    with SshHosts(workdir=tmp_path / "sshd") as hosts:
        h1, h2 = hosts.addresses
        # Servers one per host in turn (0, 2 on h1; 1, 3 on h2), then trainers on the least loaded:
        # trainer 0 on h1 (a tie: first host), trainer 1 on h2.
        argv = [sys.executable, "-m", "paramshard", "launch", "--servers", "4", "--trainers", "1:2",
                "--mode", "async", "--partitions", "256", "--timeout", "30", "--run-dir", str(run_dir),
                "--hosts", f"{h1},{h2}", "--ssh-config", hosts.ssh_config, "--remote-python", str(shim),
                str(SCRIPT), str(data), str(logs), str(hold)]
        with open(tmp_path / "out.txt", "w") as out:
            launcher = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=ENV,
                                        start_new_session=True)
        job = Output(tmp_path / "out.txt", launcher)
        try:
            at = max(job.wait_for(rf"{h} \| trainer {t} \| trainer {t} at step \d+", deadline=120)
                     for h, t in ((h1, 0), (h2, 1)))
            assert re.search(rf"{h2} \| server 3 \|", job.text()) and re.search(rf"{h1} \| server 2 \|", job.text())
            refused = scale(run_dir, "--remove-host", h1, ok=False)
            assert f"--remove-host {h1}: it runs server 0, which holds the job's routing" in refused, refused

            reply = scale(run_dir, "--remove-host", h2)
            assert (f"host {h2} removed from the job: moving the partitions and dense blocks of servers [1, 3] to "
                    f"servers [0, 2]") in reply and "asked trainers [1] to leave" in reply, reply
            (moved,) = wait_for_event(run_dir, "scale_end", 1, job)
            assert moved["servers_before"] == [0, 1, 2, 3] and moved["servers_after"] == [0, 2], moved
            assert moved["partitions"] > 0 and moved["blocks"] > 0, moved
            at = job.wait_for(r"trainer 1 left on request \(exit 0\)", at)
            # Retired (no trainer routes to them), or stopped by themselves (trainer 1 left and trainer 0
            # dropped its links to them): either way they exited, which the launcher says.
            job.wait_for(r"servers \[1, 3\] exit: ", deadline=60)
            wait_until_none(hosts, [1], job)           # nothing of the job runs on the removed host
            at = job.wait_for(r"trainer 0 at step \d+", at)                  # training goes on

            assert "starting trainers [1]" in scale(run_dir, "--trainers", "2")
            job.wait_for(rf"{h1} \| trainer 1 \| trainer 1 first step", at, deadline=60)
            assert not ranks_on(hosts, 1), "a rank started on the removed host"
            hold.unlink()
            assert launcher.wait(timeout=120) == 0, job.text()[-5000:]
        finally:
            if launcher.poll() is None:
                os.killpg(launcher.pid, 9)
                launcher.wait()
        wait_until_none(hosts, [0, 1], job, deadline=15)
    assert events(run_dir, "scale_failed") == []
    (removed,) = events(run_dir, "host_removed")
    assert (removed["host"], removed["servers"], removed["servers_after"], removed["trainers"]) == \
        (h2, [1, 3], [0, 2], [1]), removed
    changes = [(e["rank"], e["change"]) for e in events(run_dir, "membership")]
    assert sorted(changes) == sorted([("trainer 1", "asked to leave"), ("trainer 1", "left"),
                                      ("server 1", "removed"), ("server 3", "removed"),
                                      ("trainer 1", "joined")]), changes
    check_oracles({"mode": "async", "rows": "float32"}, logs)
