"""cli/stats.py: on a file, a pipe or a rank's forwarded output, `paramshard stats` prints a
plain table every few seconds instead of redrawing a screen (no escape codes in a file)."""
import argparse
import contextlib

from paramshard.cli import stats


def test_not_on_a_terminal_the_table_is_printed_plainly_each_time(monkeypatch, capsys):
    monkeypatch.setattr(stats, "_target", lambda args: None)
    monkeypatch.setattr(stats.control, "connect", lambda *a, **k: contextlib.nullcontext([]))
    monkeypatch.setattr(stats, "_table", lambda links, before: (["server 0: 12 requests/s  5 rows"], []))
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise KeyboardInterrupt            # Ctrl-C ends it, as on a terminal
    monkeypatch.setattr(stats.time, "sleep", sleep)
    monkeypatch.setattr(stats, "is_live_terminal", lambda stream: False)
    args = argparse.Namespace(json=False, once=False, every=2.0)
    assert stats.run(args) == 0
    out = capsys.readouterr().out
    assert out.count("server 0: 12 requests/s  5 rows\n") == 3 and "\x1b" not in out
    assert sleeps == [2.0, 2.0, 2.0]
