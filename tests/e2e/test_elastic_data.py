"""Issue 24's count check end to end: `paramshard launch --trainers 2:3` with the data handed
out by the shard service (DynamicShards); mid-epoch a trainer is killed (the launcher replaces
it alone, the new process joins and takes tasks), another is asked to leave and a third joins
(`paramshard scale`). Oracle: the ids every process trained, together, are every record of the
file exactly once."""
import os
import re
import signal

import pytest

from tests.e2e.run_job import rank_pids
from tests.e2e.test_elastic_launch import REPO, Job

SCRIPT = str(REPO / "tests" / "e2e" / "scripts" / "elastic_shards.py")
ROWS = 4000


def trained_ids(folder):
    return [int(x) for p in sorted(folder.glob("ids-*.txt")) for line in p.read_text().splitlines()
            for x in line.split()]


@pytest.mark.parametrize("mode", ["async", "sync"])
@pytest.mark.timeout(180)
def test_every_record_once_while_trainers_die_join_and_leave(tmp_path, mode):
    data = tmp_path / "d.svm"
    data.write_text("".join(f"{i % 2} {i}:1\n" for i in range(ROWS)))
    logs = tmp_path / "ids"
    logs.mkdir()
    job = Job(tmp_path, "--trainers", "2:3", "--mode", mode, "--max-restarts", "1", "--timeout", "10",
              script=SCRIPT, args=[str(data), str(logs), "30"])
    try:
        at = job.wait_for(r"trainer 1 ready to be killed", deadline=90)
        [victim] = rank_pids(job.mark, "trainer", 1)
        os.kill(victim, signal.SIGKILL)                       # between two steps, holding tasks
        at = job.wait_for(r"a new process takes slot 1 and joins the running job", at)
        at = job.wait_for(r"trainer 1 first step [1-9]\d*", at)
        assert "asked trainers [2] to leave" in job.scale(2)  # mid-epoch: its tasks' rest goes back
        at = job.wait_for(r"trainer 2 left on request", at)
        (logs / "hold").touch()     # the others slow down until it joined (scripts/elastic_shards.py)
        assert "starting trainers [2]" in job.scale(3)        # and a new process joins
        job.wait_for(r"trainer 2 first step [1-9]\d*", at)
        assert job.proc.wait(timeout=120) == 0, job.text()[-5000:]
    finally:
        job.close()
    ids = trained_ids(logs)
    assert len(ids) == ROWS and sorted(ids) == list(range(ROWS)), \
        f"{len(ids)} ids trained, {len(set(ids))} distinct, of {ROWS}"
    # Four processes of slots 1 and 2 took a share each (the killed one, its replacement, the
    # one that left, the one that joined)
    per_process = {p.name: len(p.read_text().split()) for p in logs.glob("ids-*.txt")}
    assert len([n for n in per_process if re.match(r"ids-[12]-", n)]) == 4, per_process
    assert all(count > 0 for count in per_process.values()), per_process
