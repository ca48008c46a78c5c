"""observe/live/terminal.py: live tables and bars only on a terminal someone watches; plain lines
in files, pipes and every rank whose output an engine forwards (mpirun gives ranks a pty)."""
import io

from paramshard.observe.live.progress import Progress
from paramshard.observe.report.server_table import StepProgress
from paramshard.observe.live.terminal import is_live_terminal


class Tty(io.StringIO):
    """A stream that says it is a terminal (as a rank's stdout under Open MPI's mpirun does)."""

    def isatty(self):
        return True


def test_only_a_terminal_outside_any_engine_is_live():
    assert is_live_terminal(Tty(), {"TERM": "xterm"})
    assert not is_live_terminal(io.StringIO(), {"TERM": "xterm"})          # a file or a pipe
    assert not is_live_terminal(Tty(), {"TERM": "dumb"})
    for variable in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        assert not is_live_terminal(Tty(), {"TERM": "xterm", variable: "0"}), variable
    assert not is_live_terminal(object(), {})           # something file-like with no isatty


def test_a_rank_under_mpirun_writes_plain_progress_with_no_escape_codes(monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    monkeypatch.setenv("TERM", "xterm-256color")
    out = Tty()
    with StepProgress(20, "epoch 1", stream=out) as bar:
        for _ in range(20):
            bar.advance("loss 0.5")
    progress = Progress(out, every=0)
    progress.update({0: {"step": 3, "samples_per_s": 10.0, "loss": 0.5}}, {})
    progress.close()
    text = out.getvalue()
    assert "\x1b" not in text and "\r" not in text
    assert text.count("epoch 1 [") == 10 and "progress | trainer 0: step 3" in text


def test_a_terminal_gets_the_live_bar(monkeypatch):
    for variable in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    bar = StepProgress(4, "epoch 1", stream=Tty())
    try:
        assert bar._bar is not None
    finally:
        bar.close()
    assert StepProgress(4, "epoch 1", stream=Tty(), live=False)._bar is None
