"""Elastic jobs with real server processes and trainer processes (no launcher): a trainer
killed, the others go on within 3 s, and a replacement joining holds them up less than 3 s
(both measured and printed); and the sync oracle: with a
trainer joining at step k and one leaving at step m, the final parameters equal one process
whose step s uses the concatenated batches of exactly the trainers that pushed step s."""
import io
import json
import os
import sys
import textwrap
import time

import numpy as np
import pytest
import torch
import torch.nn as nn

from paramshard.launch.engines.local import child_environ
from paramshard.launch.engines.processes import Child

# Starts, stops or kills server processes of its own: `make test` only, not `make check`.
pytestmark = pytest.mark.processes

LR = 0.1

SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import numpy as np, torch, torch.nn as nn
    import paramshard as ps
    folder, last, wait_at, pause = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    env = ps.init()
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    trainer = ps.Trainer(model, ps.optim.SGD(lr=0.1))
    print(f"first {trainer.step_count}", flush=True)
    if env.joining:
        open(os.path.join(folder, "joined"), "w").close()
    while trainer.step_count < last and not os.path.exists(os.path.join(folder, "stop")):
        s = trainer.step_count
        if s == wait_at:
            end = time.monotonic() + 60
            while not os.path.exists(os.path.join(folder, "joined")) and time.monotonic() < end:
                time.sleep(0.02)
        rng = np.random.default_rng(1000 * env.trainer_id + s)      # this trainer's batch of step s
        x = torch.from_numpy(rng.normal(size=(3, 4)).astype(np.float32))
        y = torch.from_numpy(rng.normal(size=(3, 2)).astype(np.float32))
        trainer.step((model(x) - y).pow(2).mean())
        print(f"pushed {s} {time.time()}", flush=True)
        time.sleep(pause)
    print("final " + json.dumps([p.detach().tolist() for p in model.parameters()]), flush=True)
    trainer.close()
""")


class Trainers:
    def __init__(self, cluster, folder):
        self.cluster, self.folder = cluster, folder
        self.script = folder / "train.py"
        self.script.write_text(SCRIPT)
        self.logs, self.procs = {}, {}

    def start(self, t, last=10**6, wait_at=-1, pause=0.02, **env):
        self.logs[t] = io.StringIO()
        argv = [sys.executable, str(self.script), str(self.folder), str(last), str(wait_at), str(pause)]
        self.procs[t] = Child(f"trainer {t}", argv,
                              child_environ(self.cluster.trainer_env(t, **env)), self.logs[t])

    def lines(self, t, word: str) -> list[str]:
        """What trainer ``t`` printed after ``word`` (its log's lines are tagged "trainer t | ")."""
        found = []
        for line in self.logs[t].getvalue().splitlines():
            text = line.split(" | ", 1)[-1]
            if text.startswith(word + " "):
                found.append(text[len(word) + 1:])
        return found

    def pushed(self, t) -> list[tuple[int, float]]:
        return [(int(a), float(b)) for a, b in (line.split() for line in self.lines(t, "pushed"))]

    def wait(self, what, deadline=60.0):
        end = time.monotonic() + deadline
        while not what():
            assert time.monotonic() < end, self.dump()
            time.sleep(0.02)

    def finish(self, deadline=60.0):
        self.wait(lambda: all(p.poll() is not None for p in self.procs.values()), deadline)
        for t, p in self.procs.items():
            p.stop()
            assert p.poll() == 0, self.dump()

    def stop(self):
        for p in self.procs.values():
            p.stop(grace=1)

    def dump(self) -> str:
        return "\n".join(f"--- trainer {t}\n{log.getvalue()[-3000:]}" for t, log in self.logs.items())


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode,extra", [("sync", {}), ("async", {"max_staleness": 0})])
def test_a_killed_trainer_the_others_go_on_within_3_s(cluster, tmp_path, mode, extra):
    # A server timeout far longer than the test: only the elastic rule can let the others go on.
    c = cluster(servers=1, trainers=3, mode=mode, timeout=60.0, min_trainers=1, **extra)
    job = Trainers(c, tmp_path)
    try:
        for t in range(3):
            job.start(t)
        job.wait(lambda: all(len(job.pushed(t)) >= 5 for t in range(3)))
        killed = time.time()
        os.kill(job.procs[2].pid, 9)
        job.wait(lambda: all(any(at > killed + 0.2 for _, at in job.pushed(t)) for t in (0, 1)), deadline=30)
        # The first step each survivor completed after the kill: how long it was held up.
        went_on = max(min(at for _, at in job.pushed(t) if at > killed) for t in (0, 1)) - killed
        print(f"\n{mode}: trainers 0 and 1 went on {went_on:.3f} s after trainer 2 was killed")
        assert went_on < 3.0, job.dump()
        # A replacement joins slot 2: the others are never held up longer than 3 s meanwhile.
        joining = time.time()
        job.start(2, joining=True)
        job.wait(lambda: len([s for s, at in job.pushed(2) if at > joining]) >= 3, deadline=45)
        joined = min(at for _, at in job.pushed(2) if at > joining)
        gaps = [b - a for t in (0, 1) for (_, a), (_, b) in zip(job.pushed(t), job.pushed(t)[1:])
                if b > joining and a < joined + 1.0]
        first = int(job.lines(2, "first")[-1])
        print(f"{mode}: while trainer 2 joined (from step {first}), the others' longest step was {max(gaps):.3f} s")
        assert max(gaps) < 3.0 and first > 5, job.dump()
        (tmp_path / "stop").touch()
        job.wait(lambda: all(job.procs[t].poll() is not None for t in (0, 1, 2)), deadline=30)
        assert [job.procs[t].poll() for t in (0, 1, 2)] == [0, 0, 0], job.dump()
    finally:
        job.stop()


def reference(steps: int, contributors: dict[int, list[int]]) -> list[np.ndarray]:
    """One process: step s is SGD on the mean loss over the concatenated batches of the trainers
    that pushed step s (equal batch sizes: the average of their mean-loss gradients)."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    for s in range(steps):
        xs, ys = [], []
        for t in contributors[s]:
            rng = np.random.default_rng(1000 * t + s)
            xs.append(rng.normal(size=(3, 4)).astype(np.float32))
            ys.append(rng.normal(size=(3, 2)).astype(np.float32))
        x, y = torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys))
        model.zero_grad()
        (model(x) - y).pow(2).mean().backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * p.grad
    return [p.detach().numpy() for p in model.parameters()]


@pytest.mark.timeout(90)
def test_sync_elastic_equals_one_process_over_the_batches_of_who_pushed_each_step(cluster, tmp_path):
    steps, join_at, leave_at = 14, 4, 9
    c = cluster(servers=2, trainers=3, mode="sync", timeout=30.0, min_trainers=1, min_block_size=2)
    job = Trainers(c, tmp_path)
    try:
        job.start(0, last=steps, wait_at=join_at)     # waits at step 4 until the joiner is in
        job.start(1, last=leave_at)                    # leaves after step 8
        job.start(2, last=steps, joining=True)         # slot 2 starts empty: this process joins it
        job.finish()
    finally:
        job.stop()
    pushed = {t: [s for s, _ in job.pushed(t)] for t in range(3)}
    first = int(job.lines(2, "first")[0])
    assert pushed[0] == list(range(steps)) and pushed[1] == list(range(leave_at)), job.dump()
    assert pushed[2] == list(range(first, steps)) and first <= join_at + 1, job.dump()
    contributors = {s: [t for t in range(3) if s in pushed[t]] for s in range(steps)}
    assert {len(c) for c in contributors.values()} == {2, 3}, contributors     # it joined, one left
    final = json.loads(job.lines(0, "final")[0])
    for got, want in zip(final, reference(steps, contributors)):
        np.testing.assert_allclose(np.array(got, np.float32), want, rtol=0, atol=2e-6)
    # The oracle can fail: the same steps with every trainer in every step differ.
    everyone = reference(steps, {s: [0, 1, 2] for s in range(steps)})
    assert not np.allclose(np.array(final[0], np.float32), everyone[0], atol=1e-4)
