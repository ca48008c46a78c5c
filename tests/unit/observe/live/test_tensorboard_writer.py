"""observe/live/tensorboard_writer.py: TensorBoard event files from the run directory's records.
Oracle: what the script logged equals what TensorBoard's own reader reads back."""
import numpy as np
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from paramshard.observe.live.tensorboard_writer import TensorBoardWriter
from paramshard.observe.run_records.trainer_records import TrainerRecords


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _read(path):
    events = EventAccumulator(str(path), size_guidance={"scalars": 0})     # 0: keep every value
    events.Reload()
    return events


def _scalars(events, tag):
    return [(e.step, e.value) for e in events.Scalars(tag)]


def test_every_logged_value_is_read_back_at_its_step(tmp_path):
    writer, clock = TensorBoardWriter(tmp_path / "tensorboard"), Clock()
    records = TrainerRecords(0, emit=writer.write, every=1.0, clock=clock)
    logged = {"test_auc": [], "lr": []}
    step = 0
    for epoch in range(1, 11):
        for _ in range(7):
            step += 1
            clock.now += 0.3                # records every ~4 steps: several epochs' ends between two
            records.on_step(step, torch.tensor(1.0 / step), 0.0, 0.0)
            records.log(lr=0.1 / step)
            logged["lr"].append((step, 0.1 / step))
        auc = 0.5 + epoch / 100
        records.log(test_auc=auc, epoch=epoch)
        logged["test_auc"].append((step, auc))
    records.close()
    writer.close()
    events = _read(tmp_path / "tensorboard/trainer-0")
    for tag, values in logged.items():
        # TensorBoard keeps float32: the logged values, rounded as it stores them
        assert _scalars(events, tag) == [(s, float(np.float32(v))) for s, v in values], tag
    loss = _scalars(events, "trainer/loss")
    assert loss and loss[-1][0] == 70 and all(0 < v <= 1 for _, v in loss)
    assert {"trainer/samples_per_s", "trainer/steps_per_s", "trainer/epoch", "trainer/pull_s"} \
        <= set(events.Tags()["scalars"])


def test_server_records_are_a_run_of_their_own(tmp_path):
    writer = TensorBoardWriter(tmp_path)
    for i, requests in enumerate((10, 30, 60)):
        writer.write({"kind": "server", "server": 1, "t": 100.0 + i, "requests": requests,
                      "requests_per_s": requests / 2, "rows": 5})
    writer.write({"kind": "event", "event": "start", "text": "", "t": 100.0})     # no run: left out
    writer.close()
    events = _read(tmp_path / "server-1")
    assert _scalars(events, "server/requests") == [(0, 10.0), (1, 30.0), (2, 60.0)]
    assert [w for w in (e.wall_time for e in events.Scalars("server/rows"))] == [100.0, 101.0, 102.0]
    assert [p.name for p in tmp_path.iterdir()] == ["server-1"]


def test_nothing_logged_no_files(tmp_path):
    writer = TensorBoardWriter(tmp_path / "tensorboard")
    writer.write({"kind": "trainer", "trainer": 0})         # no step, nothing logged
    writer.close()
    assert not (tmp_path / "tensorboard").exists()
