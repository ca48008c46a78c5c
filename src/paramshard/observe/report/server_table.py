"""Human-readable summaries of server statistics (returned as text; callers print)."""
from __future__ import annotations

from paramshard.messages.server_stats import ServerStats
from paramshard.observe.live.terminal import is_live_terminal


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f}"


def server_load_table(stats: list, title: str = "server load") -> str:
    """One line a server; addresses are listed below the table so it stays narrow. ``stats``:
    ``Trainer.server_stats()`` (the wire form) or ServerStats (messages/server_stats.py)."""
    stats = [s if isinstance(s, ServerStats) else ServerStats.from_wire(s) for s in stats]
    # Under the launcher each line gets a "trainer 0 | " prefix: 67 columns + that fit in 80.
    cols = [("server", 6), ("dense", 11), ("share", 5), ("sparse rows", 11), ("MiB in", 8), ("MiB out", 8),
            ("reqs", 7), ("errs", 4)]
    total = sum(s.dense_elements for s in stats) or 1
    lines = [title, " ".join(f"{name:>{w}}" for name, w in cols), " ".join("-" * w for _, w in cols)]
    for s in stats:
        cells = [s.server, f"{s.dense_elements:,}", f"{s.dense_elements / total:.0%}",
                 f"{s.sparse_rows:,}", _mib(s.counter("bytes_in")), _mib(s.counter("bytes_out")),
                 s.requests, s.counter("errors")]
        lines.append(" ".join(f"{str(c):>{w}}" for c, (_, w) in zip(cells, cols)))
    loads = [s.dense_elements for s in stats]
    mean = sum(loads) / len(loads) if loads else 0
    notes = [f"dense load max/mean = {max(loads) / mean:.3f}"] if mean else []
    sparse = sum(s.sparse_bytes for s in stats)
    if sparse:
        notes.append(f"sparse tables {_mib(sparse)} MiB")
    if notes:
        lines.append("; ".join(notes))
    for s in stats:              # tables with a memory budget: their disk tier
        for name, t in s.tables.items():
            if t.tier is not None:
                budget = f" of {_mib(t.tier.budget)}" if t.tier.budget else ""
                lines.append(f"tier {name!r} on server {s.server}: hit rate {t.tier.hit_rate:.3f}, "
                             f"{_mib(t.tier.resident_bytes)}{budget} MiB in RAM, {t.tier.spills:,} spills, "
                             f"{t.tier.promotions:,} promotions")
    lines.append("addresses: " + ", ".join(f"{s.server}={'?' if s.address is None else s.address}" for s in stats))
    return "\n".join(lines) + "\n"


class StepProgress:
    """Progress of a long loop: a live bar on a terminal; anywhere else (the launcher,
    a log file, a rank under mpirun or srun) a plain line every tenth of the way instead."""

    def __init__(self, total: int, title: str, stream=None, live: bool | None = None):
        import sys
        self.total, self.title, self.done = max(total, 1), title, 0
        self.stream = stream or sys.stdout
        self._bar = None
        # ``live``: a bar (a terminal someone watches: observe/live/terminal.py), else plain lines.
        if is_live_terminal(self.stream) if live is None else live:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeRemainingColumn(), transient=False,
                                 console=Console(file=self.stream))
            self._task = self._bar.add_task(title, total=self.total, info="")
            self._bar.start()

    def advance(self, info: str = "") -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(self._task, advance=1, info=info)
        elif self.done % max(1, self.total // 10) == 0 or self.done == self.total:
            filled = self.done * 30 // self.total
            self.stream.write(f"  {self.title} [{'#' * filled:<30}] {self.done}/{self.total}  {info}\n")
            self.stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
