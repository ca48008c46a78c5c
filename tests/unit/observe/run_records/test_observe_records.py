"""Trainer records and progress lines, with a fake clock: what the launcher shows and stores."""
import io
import json

import pytest
import torch

from paramshard.observe.live.progress import Progress, lines
from paramshard.observe.run_records.records import MARK
from paramshard.observe.run_records.run_dir import RunDir
from paramshard.observe.run_records.trainer_records import TrainerRecords


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


def test_every_logged_value_is_kept_with_the_step_and_epoch_it_was_logged_at():
    """10 epochs of 3 steps, records about once a second: each record held only the latest
    metric, so most epoch AUCs were lost and one was filed under the next epoch."""
    clock, out = Clock(), []
    rec = TrainerRecords(0, emit=out.append, every=1.0, clock=clock)
    step = 0
    for epoch in range(1, 11):
        rec.log(epoch=epoch)
        for _ in range(3):
            step += 1
            clock.now += 0.2
            rec.on_step(step, None, 0.0, 0.0)
        rec.log(test_auc=0.6 + epoch / 100, epoch=epoch)
    rec.close()
    assert len(out) < 10                           # fewer records than epochs: sampling alone would lose some
    calls = [c for r in out for c in r["logged"]]
    assert [(c["step"], c["epoch"], c["values"]) for c in calls] == \
        [(3 * e, e, {"test_auc": 0.6 + e / 100}) for e in range(1, 11)]
    assert all(isinstance(c["t"], float) for c in calls)


def test_run_dir_keeps_job_totals_across_a_server_restart_and_records_the_restart(tmp_path):
    run = RunDir(tmp_path / "run", "job-x")
    for requests, uptime in ((100, 4.0), (400, 6.0), (50, 1.0)):          # restarted before the third
        run.server_record({"kind": "server", "server": 1, "requests": requests, "bytes_in": requests,
                           "bytes_out": requests, "uptime_s": uptime, "staleness": {}})
    run.event("restart", "server 1: killed; restarting it in place", rank="server 1")
    run.close()
    stored = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    assert [r["requests"] for r in stored if r["kind"] == "server"] == [100, 400, 450]
    assert run.latest()[1][1]["restarts"] == 1
    event = stored[-1]
    assert event["event"] == "restart" and event["rank"] == "server 1" and "t" in event


def test_a_trainer_with_no_step_for_over_2_s_is_shown_stalled_not_at_its_last_speed():
    """A trainer stuck on a move sends no record: its last speed was shown on and on. Its last
    step's end is read on the launcher's clock (the trainers' clocks, here 4000 s apart, do
    not matter)."""
    clock, out = Clock(), io.StringIO()
    p = Progress(out, tty=False, every=0, clock=clock)

    def record(t, step, last_step_before=0.0, **more):
        return {"t": t, "step_end_t": t - last_step_before, "step": step, "samples_per_s": 100.0,
                "steps_per_s": 10.0, "total_steps": 1000, "loss": 0.5, **more}
    stuck = record(5000.0, 40, last_step_before=0.5)        # its last step ended 0.5 s before it sent this
    p.update({0: record(1000.0, 40), 1: stuck}, {})
    assert "stalled" not in out.getvalue()
    clock.now = 1.6                                           # trainer 1: 2.1 s without a step
    p.update({0: record(1001.6, 56), 1: stuck}, {})
    now = out.getvalue().splitlines()[-3:]
    assert now == ["progress | trainer 0: step 56/1000  100 samples/s  loss 0.5000",
                   "progress | trainer 1: step 40/1000  stalled: no step for 2.1 s  loss 0.5000",
                   "progress | all trainers: 100 samples/s  (1 stalled: trainer 1)"], now
    clock.now = 2.0
    p.update({0: record(1002.0, 60, done=True), 1: record(5001.9, 41)}, {})    # 1 went on, 0 finished
    now = out.getvalue().splitlines()[-3:]
    assert now == ["progress | trainer 0: step 60/1000  done  loss 0.5000",
                   "progress | trainer 1: step 41/1000  100 samples/s  loss 0.5000",
                   "progress | all trainers: 100 samples/s  ETA 96 s"], now


def test_trainer_records_say_when_the_last_step_ended_and_that_the_trainer_is_done():
    clock, out, wall = Clock(), [], [1_790_000_000.0]
    rec = TrainerRecords(0, emit=out.append, every=1.0, clock=clock, wall=lambda: wall[0])
    for step in range(1, 4):
        clock.now += 0.6
        wall[0] += 0.6
        rec.on_step(step, None, 0.0, 0.0)
    assert [(r["step"], r["step_end_t"], r.get("done")) for r in out] == [(2, 1_790_000_001.2, None)]
    wall[0] += 5.0                                  # no step since: the last record still says 1.8
    rec.close()
    rec.close()                                     # once
    assert [(r["step"], r["step_end_t"], r.get("done")) for r in out[1:]] == [(3, 1_790_000_001.8, True)]
    rec = TrainerRecords(1, emit=out.append, every=1.0, clock=clock, wall=lambda: wall[0])
    rec.close()                                     # done before any step: said too
    assert (out[-1]["step"], out[-1]["step_end_t"], out[-1]["done"]) == (0, None, True)


def test_a_job_launched_into_a_used_run_directory_is_not_taken_for_ended(tmp_path):
    from paramshard.launch.elastic.control_channel import ended
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "summary.json").write_text(json.dumps({"ended": 1.0, "exit_code": 0}))
    assert ended(tmp_path / "run")
    run = RunDir(tmp_path / "run", "job-y")             # a new job there: its summary comes at its end
    assert ended(tmp_path / "run") is None
    run.write_summary(0, [])
    run.close()
    assert "exit code 0" in ended(tmp_path / "run")
