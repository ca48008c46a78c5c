"""`paramshard report` as a command (moved from tests/unit: it starts Python): the page and
the plots where --out says, and a missing run directory is one line, no traceback."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from paramshard.observe.report.report_files import write_report
from tests.unit.observe.run_records.test_observe_report import PNGS, make_run


@pytest.fixture(scope="module")
def async_report(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("async") / "run")
    return run, write_report(run)


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "paramshard", "report", *map(str, args)], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "COLUMNS": "100"})


def test_the_command(tmp_path, async_report):
    run, _ = async_report
    out = tmp_path / "elsewhere"
    r = cli(run, "--out", out)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[-1] == str(out / "index.html")           # the page's path last, for scripts
    assert lines[0] == "failed: exit code 3 after 52.0 s"  # the run's result first (make_run's summary)
    assert all((out / name).is_file() for name in PNGS)
    page = (out / "index.html").read_text()
    assert 'href="' + os.path.relpath(run / "logs" / "trainer-0.log", out) + '"' in page
    r = cli(tmp_path / "empty-dir-that-is-missing")
    assert r.returncode == 2 and "no such directory" in r.stderr and "Traceback" not in r.stderr
