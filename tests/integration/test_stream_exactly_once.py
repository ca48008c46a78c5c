"""A sync job of two trainers trains on a DirectoryStream while a writer thread appends to it; it
is stopped (a clean stop, then a crash after its last checkpoint), resumed from its checkpoint
each time, and every record written is trained exactly once (the multiset of record ids trained
by steps the final model holds == the ids written)."""
import json
import threading
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import paramshard as ps
from paramshard.checkpoint.format import Checkpoint
from paramshard.data import StreamReader, open_stream
from paramshard.trainer.trainer import Trainer
from tests.conftest import run_in_threads

DIM, EVERY = 4, 5


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = ps.SparseEmbedding("feat", DIM, optimizer=ps.optim.Adagrad(lr=0.1), seed=5)
        self.out = nn.Linear(DIM, 1)

    def forward(self, ids):
        return self.out(self.emb(ids)).squeeze(1)


def as_tensors(batch):
    records = batch.records
    ids = [int(i) for i in records["id"]] if len(records) else []
    feats = torch.tensor([[i % 50] for i in ids], dtype=torch.int64).reshape(-1, 1)
    labels = torch.tensor([float(i % 2) for i in ids])
    return feats, labels, ids


def writer(directory, rounds, written: list, done: threading.Event):
    """A growing CSV file and a new JSON-lines file every few rounds, as a live writer makes them."""
    if not (directory / "a.csv").exists():
        with open(directory / "a.csv", "w") as f:
            f.write("id,label\n")
    for round_ in rounds:
        ids = list(range(7 * round_, 7 * round_ + 7))
        with open(directory / "a.csv", "a") as f:
            f.write("".join(f"{i},{i % 2}\n" for i in ids[:4]))
        with open(directory / f"e{round_ // 5:03d}.jsonl", "a") as f:
            f.write("".join(json.dumps({"id": i, "label": i % 2}) + "\n" for i in ids[4:]))
        written.extend(ids)
        time.sleep(0.01)
    done.set()


def run(cluster, directory, ckpt, resume, stop_at=None, crash=False, writer_done=None):
    """Train both trainers from the stream; returns each trainer's {step: record ids trained}."""
    c = cluster(servers=1, trainers=2, mode="sync", checkpoint_dir=str(ckpt), checkpoint_every=EVERY)

    def trainer_fn(tid):
        model = Model()
        trainer = Trainer(model, ps.optim.Adam(lr=0.01), env=c.trainer_env(tid), resume=ckpt if resume else None)
        reader = StreamReader(open_stream(str(directory), tid, 2), trainer, 8, poll_timeout=0.05)
        trained, empties = {}, 0
        for feats, labels, ids in trainer.prefetching(reader, convert=as_tensors):
            trained[trainer.step_count + 1] = ids
            if ids:
                trainer.step(F.binary_cross_entropy_with_logits(model(feats), labels))
            else:
                trainer.step()          # sync: no record for this trainer now, the step still counts
            if stop_at is not None and trainer.step_count >= stop_at:
                break
            # The writer is done and two polls since found nothing: this trainer's share is read.
            empties = 0 if ids or writer_done is None or not writer_done.is_set() else empties + 1
            if empties >= 2:
                break
        trainer.close(leave=not crash)      # a crash leaves no final checkpoint
        reader.close()
        return trained

    return run_in_threads([lambda t=t: trainer_fn(t) for t in range(2)], timeout=120)


def test_every_record_is_trained_once_through_a_stop_a_crash_and_resumes(cluster, tmp_path):
    directory, ckpt = tmp_path / "live", tmp_path / "ckpt"
    directory.mkdir()
    written, done = [], threading.Event()
    thread = threading.Thread(target=writer, args=(directory, range(60), written, threading.Event()), daemon=True)
    thread.start()
    kept = []
    # 1. While the writer appends, a clean stop at step 12: the final checkpoint (step 12) holds
    # what was trained.
    first = run(cluster, directory, ckpt, resume=False, stop_at=12)
    assert Checkpoint(ckpt).step == 12
    kept += [ids for trained in first for ids in trained.values()]
    # 2. Resumed, then a crash at step 23: its last checkpoint is step 20, steps 21-23 are lost
    # (the writer's first 420 records are there by then: 23 steps of 8 take at most 184 a trainer).
    thread.join(timeout=30)
    assert len(written) == 420
    second = run(cluster, directory, ckpt, resume=True, stop_at=23, crash=True)
    assert Checkpoint(ckpt).step == 20
    position = Checkpoint(ckpt).trainer_position(1)["stream"]
    assert position["rank"] == 1 and position["world"] == 2 and position["files"]
    assert min(min(trained) for trained in second) == 13
    lost = [i for trained in second for step, ids in trained.items() if step > 20 for i in ids]
    assert lost, "the crash must lose trained records, or the test shows nothing"
    kept += [ids for trained in second for step, ids in trained.items() if step <= 20]
    # 3. Resumed from step 20 while the writer appends more, until the stream is idle.
    thread = threading.Thread(target=writer, args=(directory, range(60, 80), written, done), daemon=True)
    thread.start()
    third = run(cluster, directory, ckpt, resume=True, writer_done=done)
    thread.join(timeout=30)
    assert done.is_set() and len(written) == 560
    kept += [ids for trained in third for ids in trained.values()]
    trained_ids = sorted(i for ids in kept for i in ids)
    assert trained_ids == sorted(written)               # every record once: none lost, none twice
    assert set(lost) <= {i for trained in third for ids in trained.values() for i in ids}   # replayed
