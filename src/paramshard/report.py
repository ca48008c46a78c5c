"""Human-readable summaries of server statistics (returned as text; callers print)."""
from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f}"


def server_load_table(stats: list[dict], title: str = "server load") -> str:
    table = Table(title=title)
    for col in ("server", "address", "dense blocks", "dense elements", "share", "sparse rows", "sparse MiB",
                "MiB in", "MiB out", "requests", "errors"):
        table.add_column(col, justify="right")
    total = sum(s.get("dense_elements", 0) for s in stats) or 1
    for s in stats:
        table.add_row(str(s["server"]), s.get("address", "?"), str(s.get("dense_blocks", 0)),
                      f"{s.get('dense_elements', 0):,}", f"{s.get('dense_elements', 0) / total:.1%}",
                      f"{s.get('sparse_rows', 0):,}", _mib(s.get("sparse_bytes", 0)), _mib(s.get("bytes_in", 0)), _mib(s.get("bytes_out", 0)),
                      str(s.get("requests", 0)), str(s.get("errors", 0)))
    loads = [s.get("dense_elements", 0) for s in stats]
    mean = sum(loads) / len(loads) if loads else 0
    buf = io.StringIO()
    console = Console(file=buf, width=140, force_terminal=False)
    console.print(table)
    if mean:
        console.print(f"dense load max/mean = {max(loads) / mean:.3f}")
    return buf.getvalue()


class StepProgress:
    """Progress of a long loop: a live bar on a terminal; on a pipe (the
    launcher, a log file) a plain line every tenth of the way instead."""

    def __init__(self, total: int, title: str, stream=None):
        import sys
        self.total, self.title, self.done = max(total, 1), title, 0
        self.stream = stream or sys.stdout
        self._bar = None
        if self.stream.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeRemainingColumn(), transient=False)
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
