"""`make test`'s `--dist loadgroup` keeps an xdist group on one worker (tests/xdist_groups.py): under
pytest 9 the group suffix pytest-xdist 3.8 writes was lost, and the engine tests and the users of
a module fixture were spread over both workers. Workers import pytest and xdist only (no torch)."""
import os
import re
from pathlib import Path

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[2]

ITEMS = """
import pytest

@pytest.mark.xdist_group("together")
@pytest.mark.parametrize("i", range(12))
def test_grouped(i):
    pass

@pytest.mark.parametrize("i", range(12))
def test_free(i):
    pass
"""


def test_the_items_of_one_group_run_on_one_worker(pytester, monkeypatch):
    pytester.makepyfile(test_items=ITEMS)
    pytester.makeconftest("from tests.xdist_groups import XdistGroups\n\n\n"
                          "def pytest_configure(config):\n"
                          "    config.pluginmanager.register(XdistGroups(), 'groups')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=24)
    ran = [re.match(r"\[(gw\d)\].* PASSED (\S+)", line) for line in result.outlines]
    workers = {m.group(1) for m in ran if m and "test_grouped[" in m.group(2)}
    assert len(workers) == 1, "\n".join(result.outlines)
    assert all(m.group(2).endswith("@together") for m in ran if m and "test_grouped[" in m.group(2))
    assert {m.group(1) for m in ran if m} == {"gw0", "gw1"}, "one worker ran everything: nothing was spread"
