"""Where a job's CPU goes, per training step: every process of the job over the trainers' timed window.

On a machine with fewer cores than a job has processes (2s+2w on two cores: two trainers and two
servers), a job is CPU-bound: its samples/s can be at most ``cores x batch / (CPU seconds a step,
all processes together)``. This module samples the CPU seconds of a job's process tree
(``/proc/<pid>/stat`` utime + stime: every thread of a process, ZeroMQ's I/O threads, where
CurveZMQ encrypts, among them) while the job runs; the benchmark then reads them over the window in
which every trainer was timing its steps, so start-up, imports and the final evaluation are left
out. What it gives is a measured reason: the ceiling a job's CPU cost puts on its throughput, and
how busy the cores were.
"""
from __future__ import annotations

import bisect
import os
import time

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def role_of(cmdline: str) -> str:
    """A process's part in a paramshard job (or a plain worker), from its command line."""
    if "paramshard server" in cmdline or "paramshard/__main__.py server" in cmdline:
        return "servers"
    # Before the worker test: a launcher's command line ends with its ranks' (the worker's) own.
    if " launch " in cmdline:
        return "launcher"
    if " worker " in cmdline or cmdline.endswith(" worker"):
        return "trainers"
    return "other"


def _children(pid: int) -> list[int]:
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def _cpu_seconds(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()     # after "pid (comm) ": state is field 0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class ProcessTreeCPU:
    """CPU seconds of processes and their descendants, sampled by ``sample()`` (the driver's poll
    loop). ``roots``: a pid, or pids with the role of their whole tree (None: each process's role
    from its command line, as for a launcher's tree)."""

    def __init__(self, roots: int | dict[int, str | None]):
        self.roots = {roots: None} if isinstance(roots, int) else dict(roots)
        self.series: dict[int, tuple[list[float], list[float]]] = {}     # pid -> (wall times, cpu seconds)
        self.roles: dict[int, str] = {}

    def sample(self) -> None:
        todo, now = list(self.roots.items()), time.time()
        while todo:
            pid, role = todo.pop()
            todo += [(child, role) for child in _children(pid)]
            cpu = _cpu_seconds(pid)
            if cpu is None:
                continue
            cmdline = _cmdline(pid)
            if role is not None:
                self.roles[pid] = role
            elif cmdline:                    # a wrapper exec'ing into its rank keeps its pid: the last word wins
                self.roles[pid] = role_of(cmdline)
            times, cpus = self.series.setdefault(pid, ([], []))
            times.append(now)
            cpus.append(cpu)

    def window(self, t0: float, t1: float) -> dict[str, float]:
        """CPU seconds each role spent in [t0, t1] (wall clock), interpolated between samples."""
        out: dict[str, float] = {}
        for pid, (times, cpus) in self.series.items():
            spent = _at(times, cpus, t1) - _at(times, cpus, t0)
            role = self.roles.get(pid, "other")
            out[role] = out.get(role, 0.0) + spent
        return out


def _at(times: list[float], cpus: list[float], t: float) -> float:
    """CPU seconds at time t: linear between the samples around t; 0 before a process's first
    sample (it had not started: the poll sees a new process within a period), the last value after
    its last one (it had exited)."""
    k = bisect.bisect_right(times, t)
    if k == 0:
        return 0.0
    if k == len(times):
        return cpus[-1]
    (a, b), (ca, cb) = (times[k - 1], times[k]), (cpus[k - 1], cpus[k])
    return ca + (cb - ca) * (t - a) / (b - a) if b > a else cb


def budget(cpu: ProcessTreeCPU, trainers: list[dict]) -> dict | None:
    """ms of CPU a step per role over the window in which every trainer was timing (from the
    latest start to the earliest end), and the cores that window kept busy. ``trainers``: results
    carrying ``window`` = [wall start, wall end] and ``steps_timed``. None without a common window."""
    windows = [t["window"] for t in trainers if t.get("window")]
    if len(windows) != len(trainers):
        return None
    t0, t1 = max(w[0] for w in windows), min(w[1] for w in windows)
    if t1 <= t0:
        return None
    # Steps in the common window: each trainer's timed steps scaled by the share of its own window.
    steps = sum(t["steps_timed"] * (t1 - t0) / (t["window"][1] - t["window"][0]) for t in trainers)
    spent = cpu.window(t0, t1)
    out = {role: seconds / steps * 1e3 for role, seconds in spent.items()}
    out["total"] = sum(spent.values()) / steps * 1e3
    out["cores_busy"] = sum(spent.values()) / (t1 - t0)
    return out
