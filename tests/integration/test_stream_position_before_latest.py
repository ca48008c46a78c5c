"""A trainer killed while it saves a checkpoint never leaves ``latest`` at a checkpoint without its
stream position (found by benchmarks/online_exactly_once.py's trainer kills: issue 33).

The chief used to commit the servers' state (``latest`` moved) and only then write its own
position file: a kill -9 between the two left a latest checkpoint whose trainer position was
missing, and ``--resume`` then started the stream afresh ("no saved position for this trainer")
on top of the checkpoint's model: every event before it trained twice. Here the kill is a crash
raised right after the commit moved ``latest``; the resumed run must train each record once."""
from __future__ import annotations

import torch.nn.functional as F

import paramshard as ps
from paramshard.checkpoint import format as ckformat
from paramshard.checkpoint.format import Checkpoint
from paramshard.data import StreamReader, open_stream
from paramshard.trainer.trainer import Trainer
from tests.integration.test_stream_exactly_once import Model, as_tensors

RECORDS, BATCH, EVERY, CRASH_AT = 120, 8, 5, 10


class Killed(BaseException):
    """The process's death right after ``latest`` moved (BaseException: nothing handles it)."""


def run(cluster, directory, ckpt, resume: bool) -> dict[int, list[int]]:
    """One trainer trains from the directory until its records are read: {step: ids trained}."""
    c = cluster(servers=1, trainers=1, mode="sync", checkpoint_dir=str(ckpt), checkpoint_every=EVERY)
    model = Model()
    trainer = Trainer(model, ps.optim.Adam(lr=0.01), env=c.trainer_env(0), resume=ckpt if resume else None)
    reader = StreamReader(open_stream(str(directory), 0, 1), trainer, BATCH, poll_timeout=0.05)
    trained: dict[int, list[int]] = {}
    try:
        for feats, labels, ids in trainer.prefetching(reader, convert=as_tensors):
            if not ids:
                break                    # every record written is read
            trained[trainer.step_count + 1] = ids
            trainer.step(F.binary_cross_entropy_with_logits(model(feats), labels))
    except Killed:
        trainer.close(leave=False)       # a dead process saves nothing more
        reader.close()
        return trained
    trainer.close()
    reader.close()
    return trained


def test_a_kill_right_after_latest_moves_loses_no_position(cluster, tmp_path, monkeypatch):
    directory, ckpt = tmp_path / "live", tmp_path / "ckpt"
    directory.mkdir()
    (directory / "a.csv").write_text("id,label\n" + "".join(f"{i},{i % 2}\n" for i in range(RECORDS)))
    commit = ckformat.CheckpointWriter.commit

    def commit_then_die(self, manifest, keep=None):
        path = commit(self, manifest, keep)
        if self.step == CRASH_AT:
            raise Killed(f"killed once checkpoint {self.step} is latest")
        return path

    monkeypatch.setattr(ckformat.CheckpointWriter, "commit", commit_then_die)
    first = run(cluster, directory, ckpt, resume=False)
    assert max(first) == CRASH_AT and Checkpoint(ckpt).step == CRASH_AT
    monkeypatch.setattr(ckformat.CheckpointWriter, "commit", commit)
    # The latest checkpoint holds the position of the batches its steps trained.
    position = Checkpoint(ckpt).trainer_position(0)
    assert position is not None and position["stream"]["files"]["a.csv"]["records"] == CRASH_AT * BATCH
    second = run(cluster, directory, ckpt, resume=True)
    assert min(second) == CRASH_AT + 1
    trained = sorted(i for step, ids in first.items() if step <= CRASH_AT for i in ids)
    trained += sorted(i for ids in second.values() for i in ids)
    assert sorted(trained) == list(range(RECORDS))       # each record once: none twice, none lost
