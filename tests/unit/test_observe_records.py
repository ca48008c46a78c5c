"""Trainer records and progress lines, with a fake clock: what the launcher shows and stores."""
import io
import json

import pytest
import torch

from paramshard.observe.progress import Progress, lines
from paramshard.observe.records import MARK
from paramshard.observe.run_dir import RunDir
from paramshard.observe.trainer_records import TrainerRecords


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_records_count_samples_from_the_forward_rates_phases_and_late_logs():
    clock, out = Clock(), []
    rec = TrainerRecords(3, emit=out.append, every=1.0, clock=clock)
    model = torch.nn.Linear(4, 1)
    rec.watch(model)
    rec.log(total_steps=10, epoch=1)
    pull = push = 0.0
    for step in range(1, 5):
        model(torch.zeros(16, 4))                  # 16 samples a step, seen by the pre-hook
        clock.now += 0.5
        pull, push = pull + 0.1, push + 0.05
        rec.on_step(step, torch.tensor(float(step)), pull, push, staleness=step % 3)
    assert [r["step"] for r in out] == [2, 4]
    first = out[0]
    assert first["trainer"] == 3 and first["samples"] == 32 and first["samples_per_s"] == pytest.approx(32.0)
    assert first["loss"] == pytest.approx(1.5) and first["staleness_max"] == 2
    assert first["phases"] == pytest.approx({"pull": 0.1, "push": 0.05, "compute": 0.35})
    assert first["total_steps"] == 10 and first["epoch"] == 1
    rec.log(auc=0.7)                               # after the last step: still recorded at close
    clock.now += 3
    rec.close()
    assert out[-1]["step"] == 4 and out[-1]["metrics"] == {"auc": 0.7}
    assert out[-1]["samples_per_s"] == out[-2]["samples_per_s"]      # no new step: the rate stays
    rec.log(samples=5)
    rec.on_step(5, None, pull, push)
    assert rec.samples == 64 + 5                   # logged samples win over the forward's


def test_run_dir_takes_records_out_of_the_output_and_logs_the_rest(tmp_path):
    run = RunDir(tmp_path / "run", "job-x")

    class Rank:
        name = "trainer 0"

    tap = run.tap_for(Rank())
    record = {"kind": "trainer", "trainer": 0, "step": 7, "samples": 70}
    assert tap(MARK + json.dumps(record) + "\n") is True
    assert tap("hello\n") is False
    assert tap(MARK + "{torn") is True                     # a torn record is dropped, not printed
    run.close()
    assert (tmp_path / "run/logs/trainer-0.log").read_text() == "hello\n"
    stored = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert stored[0]["step"] == 7 and "t" in stored[0]


def test_progress_lines_and_plain_output():
    trainers = {0: {"step": 5, "total_steps": 10, "samples_per_s": 100.0, "steps_per_s": 1.0, "loss": 0.5},
                1: {"step": 8, "total_steps": 10, "samples_per_s": 200.0, "steps_per_s": 2.0, "loss": None}}
    servers = {0: {"requests_per_s": 10, "rows": 5, "elements": 30}, 1: {"requests_per_s": 5, "rows": 7, "elements": 10}}
    text = lines(trainers, servers)
    assert text[0] == "trainer 0: step 5/10  100 samples/s  loss 0.5000"
    assert "75% of dense" in text[2] and "25% of dense" in text[3]
    assert text[-1] == "all trainers: 300 samples/s  ETA 5 s"      # the slower trainer: 5 steps at 1/s
    out = io.StringIO()
    p = Progress(out, tty=False, every=100)
    p.update(trainers, servers)
    p.update(trainers, servers)                  # within the interval: nothing more
    p.update(trainers, servers, force=True)
    assert out.getvalue().count("progress | trainer 0:") == 2
