"""Test infrastructure for launch engines that reach real hosts (SSH, network namespaces),
and for the engines `paramshard run` runs under (``tests.engines.mpi``: OpenMPI;
``tests.engines.slurm``: a throwaway Slurm cluster).

- ``tests.engines.sshd``: :class:`SshHosts`, throwaway sshd "hosts" on loopback aliases or
  inside network namespaces, plus :func:`require_engines` and pytest fixtures.
- ``tests.engines.netns``: :class:`NetnsLab`, a bridge and one network namespace per host
  on a private subnet that the root namespace routes nowhere (an ``unreachable`` route).
- ``tests.engines.shaped``: :class:`ShapedLab`, a NetnsLab whose hosts' links are rate-limited
  both ways (tc tbf; no latency: netem is not in this kernel) and whose link byte counters
  are read per host; benchmarks/modes_shaped.py runs jobs on it.

Everything here needs root, ``sshd``/``ssh``/``rsync``/``ip``: install them with
``scripts/install-test-engines.sh`` (as root). Without them the tests skip and say so,
unless ``PARAMSHARD_REQUIRE_ENGINES=1`` (set by ``.ci/run`` after a successful install),
which turns those skips into failures.

This module holds the process helpers both use: processes are only ever stopped by PID,
and only the ones this code started (or their descendants, or processes inside the
namespaces it created).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

INSTALL_HINT = ("install the engines with `sudo scripts/install-test-engines.sh` (openssh-server, openssh-client, "
                "rsync, iproute2; it also installs openmpi-bin, slurm-wlm and munge) and run the tests as root")
REQUIRE_ENV = "PARAMSHARD_REQUIRE_ENGINES"


def engines_required() -> bool:
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def unavailable(reason: str, hint: str = INSTALL_HINT) -> None:
    """Skip the calling test (or fail it when the engines are required) with ``reason``
    and ``hint``, how to install what is missing."""
    import pytest

    message = f"{reason}; {hint}"
    if engines_required():
        pytest.fail(f"{REQUIRE_ENV} is set but: {message}", pytrace=False)
    pytest.skip(message)


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may contain spaces or parentheses.
    rest = data[data.rfind(b")") + 2:].split()
    return int(rest[19])


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        ppid = int(data[data.rfind(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(name))
    return children


def process_levels(pid: int) -> list[list[tuple[int, int]]]:
    """``pid`` and its living descendants as (pid, start time) pairs, level by level:
    ``[[pid], [its children], [their children], ...]``."""
    children = _children_map()
    levels, level = [], [pid]
    while level:
        found = [(p, st) for p in level if (st := start_time(p)) is not None]
        if not found:
            break
        levels.append(found)
        level = [c for p, _ in found for c in children.get(p, ())]
    return levels


def process_tree(pid: int) -> list[tuple[int, int]]:
    """``pid`` and its living descendants as (pid, start time) pairs, parents first."""
    return [proc for level in process_levels(pid) for proc in level]


def signal_if_same(pid: int, start: int, sig: int) -> bool:
    """Send ``sig`` to ``pid`` only if it is still the process that started at ``start``."""
    if start_time(pid) != start:
        return False
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def alive(pid: int, start: int) -> bool:
    st = start_time(pid)
    if st != start:
        return False
    try:  # a zombie still has a /proc entry: it counts as gone
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return data[data.rfind(b")") + 2:data.rfind(b")") + 3] != b"Z"
    except OSError:
        return False


def _gone(pid: int, start: int) -> bool:
    """True once ``pid`` is no longer that process, not even as a zombie waiting to be reaped."""
    return start_time(pid) != start


def stop_processes(procs: list[tuple[int, int]], grace: float = 3.0, popens=(), sig: int = signal.SIGTERM) -> None:
    """Send ``sig`` to every (pid, start) in ``procs``, wait up to ``grace`` s for them to
    exit, then SIGKILL the rest. ``popens`` (subprocess.Popen objects among them) are reaped.
    """
    for pid, st in procs:
        signal_if_same(pid, st, sig)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        for p in popens:
            p.poll()
        if not any(alive(pid, st) for pid, st in procs):
            break
        time.sleep(0.02)
    for pid, st in procs:
        if alive(pid, st):
            signal_if_same(pid, st, signal.SIGKILL)
    for p in popens:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def stop_tree(popen: subprocess.Popen, grace: float = 3.0, sig: int = signal.SIGTERM) -> None:
    """Stop a process this code started and every descendant it has (by PID).

    The deepest descendants go first, and each level is given a moment to be reaped by its
    (still living) parents, so that no zombie is left to the machine's init; then the next
    level up, and last the process itself.
    """
    if popen.poll() is not None:
        return
    levels = process_levels(popen.pid)
    for level in reversed(levels[1:]):
        stop_processes(level, grace=grace, sig=sig)
        deadline = time.monotonic() + 1.0
        while any(not _gone(pid, st) for pid, st in level) and time.monotonic() < deadline:
            time.sleep(0.01)
    # The root, and anything it forked meanwhile.
    stop_processes(process_tree(popen.pid) or levels[:1], grace=grace, popens=[popen], sig=sig)
