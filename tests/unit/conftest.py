"""Unit items over their time budget are reported, never failed (issue 31): unit tests are the
seconds-long stage a developer runs on every change, so a slow one is a defect to fix, to move to
tests/integration, or to mark ``@pytest.mark.slow_unit(reason="...")`` with why it cannot be
faster. A timed assertion fails at random on a loaded machine (CI failed twice on items at
1.3-1.6 s that take 0.3 s alone), so the budget is a list at the end of the run, not a verdict:
``PARAMSHARD_UNIT_LIMIT_S`` seconds (default 1; 0: not measured), on the call phase's wall time
less the time the test's thread waited for a CPU while it could have run
(/proc/thread-self/schedstat). The list is printed by tests/conftest.py (the xdist controller
loads that one); each over-budget item carries its cost as the report's user property
``unit_cost_s``.

``make check`` (the developer's stage, not CI's) also sets PARAMSHARD_UNIT_LIMIT_STRICT=1: there an
item whose process used more than twice the budget in CPU time fails. CPU time, not wall time:
another job's load does not add waiting to it (and it counts the pool threads of pandas and arrow
that wall time less the thread's own run-queue wait missed); twice, because CPU time still
inflates under load (two hyper-threads share a core's caches: a hypothesis test under 1 s in
a quiet run used 1.4-1.8 s beside other jobs).

The compiled row store's kernels must be in numba's cache (`make warm`, which `make check` and
`make test` run first): a test that compiles one pays seconds (e.g. after kernel sources moved).
"""
from __future__ import annotations

import importlib
import os
import time

import pytest

# Libraries that paramshard imports lazily (seconds of CPU the first time): imported here, once
# for the stage, so that their cost does not land on whichever unit test happens to run first.
for _library in ("torch", "pandas", "numba", "sklearn", "paramshard.observe.report.plots"):
    importlib.import_module(_library)
# torch's first optimizer imports its compiler stack (~2 s here), whichever test builds it first.
_torch = importlib.import_module("torch")
_torch.optim.SGD(_torch.nn.Linear(1, 1).parameters(), lr=0.1)

LIMIT_VARIABLE = "PARAMSHARD_UNIT_LIMIT_S"
DEFAULT_LIMIT_S = 1.0
UNIT_COST_PROPERTY = "unit_cost_s"
STRICT_VARIABLE = "PARAMSHARD_UNIT_LIMIT_STRICT"


def unit_limit() -> float:
    raw = os.environ.get(LIMIT_VARIABLE, "")
    if not raw:
        return DEFAULT_LIMIT_S
    try:
        limit = float(raw)
    except ValueError:
        raise pytest.UsageError(f"{LIMIT_VARIABLE}={raw!r}: expected seconds (e.g. 1 or 2.5; 0: no limit)") from None
    if limit < 0:
        raise pytest.UsageError(f"{LIMIT_VARIABLE}={raw!r}: expected seconds >= 0 (0: no limit)")
    return limit


def run_queue_wait() -> float:
    """Seconds this thread has waited on a run queue while runnable (0 where the kernel does
    not say: then the check is on wall time alone)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    limit = unit_limit()
    marker = item.get_closest_marker("slow_unit")
    if marker is not None and not marker.kwargs.get("reason") and not marker.args:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.slow_unit needs reason=\"why it cannot be faster\"")
    started, waited, cpu = time.perf_counter(), run_queue_wait(), time.process_time()
    result = yield                   # a failing test fails as it is; only a passing one is timed
    cost = (time.perf_counter() - started) - (run_queue_wait() - waited)
    cpu = time.process_time() - cpu
    if limit and marker is None and cost > limit:
        item.user_properties.append((UNIT_COST_PROPERTY, round(cost, 2)))
    if limit and marker is None and cpu > 2 * limit and os.environ.get(STRICT_VARIABLE) == "1":
        pytest.fail(f"unit test used {cpu:.2f} s of CPU, over twice the {limit:g} s budget of a unit item: make it "
                    f"faster, move it to tests/integration, or mark it @pytest.mark.slow_unit(reason=...)",
                    pytrace=False)
    return result
