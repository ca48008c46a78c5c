"""A memory-budget table whose disk tier fills its file system (server/storage/tier_space.py): a real
`paramshard server` process with --checkpoint-dir on an 8 MiB tmpfs (the tier lives in tier/
under it), trained past that space with real pulls and pushes. The trainer gets the named
error (code disk_full: the table, the directory, bytes needed and free); the server does not
die of SIGBUS: it keeps serving the rows the table holds, and exits cleanly when stopped.
(Before the disk tier reserved its space, a write into a hole of the full tmpfs was a SIGBUS
that killed the server, and the trainer saw only a lost server.)"""
import dataclasses
import io
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import paramshard as ps
from paramshard.budgets import MIN_BUDGET
from paramshard.env import ClusterEnv
from paramshard.errors import RemoteError
from paramshard.launch.engines.local import child_environ
from paramshard.launch.engines.ports import free_ports
from paramshard.launch.engines.processes import Child, stop_all
from paramshard.trainer.trainer import Trainer

# Starts, stops or kills server processes of its own: `make test` only, not `make check`.
pytestmark = pytest.mark.processes

DIM = 64
NEW_IDS = 4000          # new rows a step: ~2 MiB of tier files (values, Adagrad's slot, last-seen)


@pytest.fixture
def small_disk(tmp_path):
    """An 8 MiB tmpfs, always unmounted after the test."""
    where = tmp_path / "small-disk"
    where.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"mount -t tmpfs is not permitted here: {made.stderr.strip() or made.returncode}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(where)], check=True)     # busy: detached now, freed when let go


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = ps.SparseEmbedding("emb", DIM, optimizer=ps.optim.Adagrad(lr=0.1), init_scale=0.1,
                                      eviction=ps.Eviction(unseen_steps=1000), memory_budget=MIN_BUDGET)
        self.head = nn.Linear(DIM, 1)

    def rows(self, ids):
        return self.emb(ids.reshape(-1, 1)).view(len(ids), DIM)

    def forward(self, ids):
        return self.head(self.rows(ids)).sum()


def test_a_full_disk_tier_is_a_named_error_for_the_trainer_not_a_sigbus(small_disk):
    [port] = free_ports(1)
    base = ClusterEnv(role=None, servers=(f"127.0.0.1:{port}",), num_trainers=1, timeout=30.0)
    out = io.StringIO()
    server = Child("server 0", [sys.executable, "-m", "paramshard", "server"],
                   child_environ(dataclasses.replace(base, role="server", server_id=0,
                                                                    checkpoint_dir=str(small_disk))), out=out)
    try:
        model = Model()
        trainer = Trainer(model, ps.optim.SGD(lr=0.01), env=dataclasses.replace(base, role="trainer", trainer_id=0))
        steps = 0
        with pytest.raises(RemoteError) as refused:
            for step in range(8):               # 8 steps x ~2 MiB could never fit in 8 MiB
                ids = torch.arange(step * NEW_IDS, (step + 1) * NEW_IDS)
                trainer.step(model(ids))
                steps += 1
        error = refused.value
        assert error.code == "disk_full", error
        tier = small_disk / "tier" / "server-0" / "emb"
        assert f"table 'emb': disk tier full: {tier} needs " in error.remote_message, error
        needed = int(error.remote_message.split(" needs ")[1].split(" bytes")[0])
        free = int(error.remote_message.split(" there has ")[1].split(" bytes")[0])
        assert needed > free >= 0 and free < 8 << 20, error.remote_message
        assert 1 <= steps < 4, f"{steps} steps of {NEW_IDS} new rows fit in 8 MiB"
        assert server.poll() is None, server.describe_exit()
        # The server goes on: the rows the table holds are served (and trained) as before.
        held = torch.arange(0, NEW_IDS)
        before = model.rows(held).detach().clone()
        trainer.step(model(held))
        after = model.rows(held).detach()
        assert torch.isfinite(after).all() and not torch.equal(before, after)
        trainer.close()
        assert server.poll() is None, server.describe_exit()
    finally:
        stop_all([server], grace=10)
    log = out.getvalue()
    assert server.proc.returncode not in (-signal.SIGBUS, -signal.SIGKILL), server.describe_exit() + "\n" + log
    assert server.proc.returncode == 0, server.describe_exit() + "\n" + log      # SIGTERM: a clean stop
    assert "rejected pull_sparse request: table 'emb': disk tier full" in log or \
        "rejected push_sparse request: table 'emb': disk tier full" in log, log
    assert "SIGBUS" not in log and "Fatal Python error" not in log, log
    assert not (small_disk / "tier").exists() or not any((small_disk / "tier").iterdir())    # its files went
