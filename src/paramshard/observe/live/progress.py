"""Live progress on the launcher's terminal: a line per trainer (step, epoch,
samples/s, loss) and per server (requests/s, rows, share of the dense load),
overall throughput and, when the trainers said how many steps they take, ETA.

A trainer that has not finished a step for more than ``STALLED_AFTER`` seconds (waiting on a
move, a lost peer, a hung server) is shown ``stalled`` with for how long, not with the speed of
its last record, which it no longer has; one whose last record says it is done, ``done``.
When its last step ended is read on this machine's clock (``StepClock``: when its record
arrived, less the record's own age of that step), so other hosts' clocks do not matter.

On a terminal it is a rich live table below the processes' output; anywhere
else (a pipe, a file, CI logs, a rank under mpirun: observe/live/terminal.py) plain lines every ``PLAIN_EVERY`` seconds, prefixed
``progress |`` like the processes' own lines.
"""
from __future__ import annotations

import sys
import threading
import time

from paramshard.observe.live.terminal import is_live_terminal

PLAIN_EVERY = 10.0
STALLED_AFTER = 2.0         # seconds without a finished step: a trainer is stalled (records come every ~1 s)


def _rate(x) -> str:
    return f"{x:,.0f}" if isinstance(x, (int, float)) else "-"


def _loss(x) -> str:
    return f"{x:.4f}" if isinstance(x, (int, float)) else "-"


def _seconds(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


class StepClock:
    """How long ago each trainer's last step ended, on this machine's monotonic clock: a record
    seen for the first time dates its last step ``t - step_end_t`` (its own clock) before now."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._seen: dict[int, tuple[tuple, float]] = {}      # trainer -> (its record's key, last step end)

    def idle(self, trainers: dict) -> dict[int, float]:
        now = self.clock()
        out = {}
        for t, r in trainers.items():
            key = (r.get("t"), r.get("step"), r.get("done"))
            seen = self._seen.get(t)
            if seen is None or seen[0] != key:
                sent, ended = _seconds(r.get("t")), _seconds(r.get("step_end_t"))
                age = max(0.0, sent - ended) if sent is not None and ended is not None else 0.0
                seen = self._seen[t] = (key, now - age)
            out[t] = now - seen[1]
        return out


def stalled(r: dict, idle: float | None) -> bool:
    return not r.get("done") and idle is not None and idle > STALLED_AFTER


def trainer_line(t: int, r: dict, idle: float | None = None) -> str:
    """``idle``: seconds since its last step ended (None: not known)."""
    epoch = f" epoch {r['epoch']}" if r.get("epoch") is not None else ""
    total = f"/{r['total_steps']}" if r.get("total_steps") else ""
    stale = f"  staleness {r['staleness_max']}" if r.get("staleness_max") is not None else ""
    if r.get("done"):
        speed = "done"
    elif stalled(r, idle):
        speed = f"stalled: no step for {idle:,.1f} s"
    else:
        speed = f"{_rate(r.get('samples_per_s'))} samples/s"
    return f"trainer {t}: step {r.get('step', 0)}{total}{epoch}  {speed}  loss {_loss(r.get('loss'))}{stale}"


def server_line(s: int, r: dict, total_elements: int) -> str:
    line = f"server {s}: {_rate(r.get('requests_per_s'))} requests/s  {r.get('rows', 0):,} rows"
    if not total_elements:        # hybrid mode: the dense parameters are on the trainers
        return line
    return f"{line}  {r.get('elements', 0):,} elements ({r.get('elements', 0) / total_elements:.0%} of dense)"


def overall_line(trainers: dict, idle: dict | None = None) -> str:
    """The trainers' speed now: a stalled or done trainer adds nothing; no ETA while one is stalled."""
    idle = idle or {}
    stuck = sorted(t for t, r in trainers.items() if stalled(r, idle.get(t)))
    going = {t: r for t, r in trainers.items() if t not in stuck and not r.get("done")}
    rate = sum(r.get("samples_per_s") or 0 for r in going.values())
    line = f"all trainers: {_rate(rate)} samples/s"
    if stuck:
        return line + f"  ({len(stuck)} stalled: trainer{'s' if len(stuck) > 1 else ''} " \
            f"{', '.join(map(str, stuck))})"
    remaining = [(r["total_steps"] - r.get("step", 0), r.get("steps_per_s")) for r in going.values()
                 if r.get("total_steps")]
    etas = [left / speed for left, speed in remaining if speed]
    if etas and len(remaining) == len(going):
        line += f"  ETA {max(0, max(etas)):,.0f} s"
    return line


def lines(trainers: dict, servers: dict, idle: dict | None = None) -> list[str]:
    """``idle``: seconds since each trainer's last step ended (StepClock.idle)."""
    idle = idle or {}
    total = sum(r.get("elements", 0) for r in servers.values())
    return ([trainer_line(t, r, idle.get(t)) for t, r in sorted(trainers.items())]
            + [server_line(s, r, total) for s, r in sorted(servers.items())]
            + ([overall_line(trainers, idle)] if trainers else []))


class Progress:
    """``update(trainers, servers)`` with the latest records; ``close()`` at the end."""

    def __init__(self, out=None, tty: bool | None = None, every: float = PLAIN_EVERY, clock=time.monotonic):
        self.out = out or sys.stdout
        self.steps = StepClock(clock)
        # A rank under mpirun is "on a terminal" by isatty() even when mpirun writes to a file.
        self.tty = is_live_terminal(self.out) if tty is None else tty
        self.every = every
        self._last = 0.0
        self._lock = threading.Lock()
        self._live = None
        if self.tty:
            from rich.console import Console
            from rich.live import Live
            self.console = Console(file=self.out)
            self._live = Live(console=self.console, refresh_per_second=2, transient=False)   # the last table stays
            self._live.start()

    def writer(self):
        """Where the processes' lines go while the live table is shown (above it)."""
        return _ConsoleOut(self.console) if self._live is not None else self.out

    def update(self, trainers: dict, servers: dict, force: bool = False) -> None:
        text = lines(trainers, servers, self.steps.idle(trainers))
        if not text:
            return
        with self._lock:
            if self._live is not None:
                from rich.text import Text
                self._live.update(Text("\n".join(text)))
                return
            now = time.monotonic()
            if now - self._last < self.every and not force:
                return
            self._last = now
            self.out.write("".join(f"progress | {line}\n" for line in text))
            self.out.flush()

    def close(self) -> None:
        with self._lock:
            if self._live is not None:
                self._live.stop()
                self._live = None


class _ConsoleOut:
    """A file-like object printing through a rich console (so it scrolls above the live table)."""

    def __init__(self, console):
        self.console = console

    def write(self, text: str) -> int:
        self.console.print(text, end="", markup=False, highlight=False, soft_wrap=True)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True
