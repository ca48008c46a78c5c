"""A running SSH job over network namespaces takes a host it did not start with: `paramshard scale
RUN_DIR --add-host HOST --servers N --on HOST` starts a server there (a job launched with
--partitions), and, the host being the least loaded one, `--trainers N` a trainer there, training goes on, the job ends 0 and nothing of it is left on any
host. Every process binds inside the lab's namespaces (tests/engines/netns.py: the root namespace
routes the lab's subnet nowhere); `paramshard scale` itself only writes files in the run directory."""
import json
import os
import re
import subprocess
import sys
import time

import pytest

from tests.engines.netns import NetnsLab, require_netns
from tests.engines.sshd import SshHosts, require_engines

from tests.e2e.run_job import REPO, VENV_BIN
from tests.e2e.test_ssh_launch import rank_processes

SCRIPTS = REPO / "tests" / "e2e" / "scripts"


class Output:
    def __init__(self, path, proc):
        self.path, self.proc = path, proc

    def text(self) -> str:
        return self.path.read_text()

    def wait_for(self, pattern: str, after: int = 0, deadline: float = 40.0) -> int:
        """Wait until ``pattern`` appears past offset ``after``; its end offset."""
        end = time.monotonic() + deadline
        while True:
            found = re.compile(pattern).search(self.text(), after)
            if found:
                return found.end()
            assert time.monotonic() < end and self.proc.poll() is None, \
                f"no {pattern!r} in time:\n{self.text()[-5000:]}"
            time.sleep(0.05)


def scale(run_dir, *flags) -> str:
    done = subprocess.run([sys.executable, "-m", "paramshard", "scale", str(run_dir), *flags, "--wait", "40"],
                          capture_output=True, text=True, timeout=90, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return done.stdout


def events(run_dir, kind):
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if r.get("event") == kind]


def wait_for_event(run_dir, kind, count, job, deadline=60.0):
    end = time.monotonic() + deadline
    while len(events(run_dir, kind)) < count:
        assert time.monotonic() < end and job.proc.poll() is None, f"no {kind} event #{count}:\n{job.text()[-4000:]}"
        time.sleep(0.1)
    return events(run_dir, kind)


@pytest.mark.timeout(150)
def test_a_host_added_to_a_running_job_takes_a_new_trainer_and_a_new_server(tmp_path):
    require_engines(())
    require_netns()
    # The remote ranks import the paramshard this test imports (PYTHONPATH does not cross ssh).
    shim = tmp_path / "python.sh"
    shim.write_text(f"#!/bin/sh\nPYTHONPATH={os.environ.get('PYTHONPATH', '')} exec {VENV_BIN / 'python'} \"$@\"\n")
    shim.chmod(0o755)
    run_dir, stop = tmp_path / "run", tmp_path / "stop"
    with NetnsLab(4, subnet="10.213.11.0/24") as lab, SshHosts.in_lab(lab, workdir=tmp_path / "sshd") as hosts:
        h1, h2, h3 = lab.addresses[1:]
        # h2 takes one rank: server 1; server 0 and trainers 0, 1 go to h1. The added h3, running
        # nothing, is the least loaded host for the next server; once trainer 1 left, h1 and h3 run
        # two ranks and one: h3 again for the next trainer.
        # --timeout 30, not less: on a loaded 2-core machine a server once answered nothing for 20 s
        # while the ranks started (the trainers then rightly gave up).
        argv = [sys.executable, "-m", "paramshard", "launch", "--servers", "2", "--trainers", "1:2",
                "--mode", "async", "--partitions", "64", "--timeout", "30", "--run-dir", str(run_dir),
                "--hosts", f"{h1},{h2} slots=1", "--ssh-config", hosts.ssh_config, "--remote-python", str(shim),
                "--dispatch-package", str(SCRIPTS), "--workspace", str(tmp_path / "ws"),
                str(SCRIPTS / "elastic_sparse.py"), str(stop)]
        with open(tmp_path / "out.txt", "w") as out:
            launcher = lab.run(0, argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        job = Output(tmp_path / "out.txt", launcher)
        try:
            at = max(job.wait_for(rf"{h1} \| trainer {t} \| trainer {t} at step \d+", deadline=90) for t in (0, 1))
            reply = scale(run_dir, "--add-host", h3, "--servers", "3", "--on", h3)
            assert f"host {h3} added to the job" in reply and "same machine" in reply, reply
            assert "started servers [2]" in reply
            (moved,) = wait_for_event(run_dir, "scale_end", 1, job)
            assert moved["servers_after"] == [0, 1, 2] and moved["partitions"] > 0
            assert re.search(rf"{h3} \| server 2 \|", job.text())
            at = max(job.wait_for(rf"trainer {t} at step \d+", at) for t in (0, 1))    # training goes on

            assert "asked trainers [1] to leave" in scale(run_dir, "--trainers", "1")
            at = job.wait_for(r"trainer 1 left on request \(exit 0\)", at)
            assert "starting trainers [1]" in scale(run_dir, "--trainers", "2")
            at = job.wait_for(rf"{h3} \| trainer 1 \| trainer 1 at step \d+", at, deadline=60)
            job.wait_for(r"trainer 0 at step \d+", at)
            stop.touch()
            assert launcher.wait(timeout=60) == 0, job.text()[-5000:]
        finally:
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait()
        deadline = time.monotonic() + 15
        while rank_processes(hosts) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert rank_processes(hosts) == [], "ranks left behind in the namespaces"
    added = events(run_dir, "host_added")
    assert [(e["host"], e["files_sent"]) for e in added] == [(h3, None)]
    changes = [(e["rank"], e["change"]) for e in events(run_dir, "membership")]
    assert changes == [("server 2", "added"), ("trainer 1", "asked to leave"), ("trainer 1", "left"),
                       ("trainer 1", "joined")], changes
