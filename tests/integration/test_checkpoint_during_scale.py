"""Checkpoints taken while a server scale runs, and a resume on another number of servers
(issue 29 item 4: checkpoints and moves take turns on server 0).

Two sync trainers train a table (Adagrad) and dense parameters (Adam); the chief checkpoints
after every step of a window in which a third server takes its share of the partitions and
blocks (2 -> 3). Oracles, from the sync determinism (tests/integration/test_server_scaling_sync.py):
- every checkpoint of the scaled run holds exactly what the same step's checkpoint of a run
  without the scale holds (rows with their optimizer slots, dense values and slots), the ones
  taken while the partitions were handed off included;
- resuming from a checkpoint written by 3 servers on a fresh job of 2 servers and training to
  the end gives the model of the uninterrupted run, bit for bit;
- a rollback of the scaled job after servers 0 and 2 were restarted in place restores its
  latest checkpoint onto the 3 servers, rows and dense blocks where the routing places them now.
"""
from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

import paramshard as ps
from paramshard.checkpoint.format import Checkpoint, step_dir_name
from paramshard.client.checkpoint import restore_checkpoint, save_checkpoint
from paramshard.client.recovery import roll_back
from paramshard.client.dense import DenseClient
from paramshard.client.sparse import SparseClient, TableSpec
from paramshard.env import ClusterEnv
from paramshard.launch.engines.local import child_environ
from paramshard.launch.engines.ports import free_ports
from paramshard.launch.engines.processes import Child, stop_all
from paramshard.launch.elastic.server_scaling import move_partitions
from paramshard.placement.partitions import Routing
from paramshard.placement.sharding import ParamSpec, make_plan
from paramshard.transport.links import ServerLinks
from paramshard.update_rules import make_rule
from tests.conftest import run_in_threads

# Starts, stops or kills server processes of its own: `make test` only, not `make check`.
pytestmark = pytest.mark.processes

TRAINERS, PARTITIONS, TIMEOUT, STEPS, SCALE_AT, WINDOW = 2, 64, 20.0, 60, 5, 30
TABLE, DIM = "emb", 8
PLAN = make_plan([ParamSpec("w", (64, 4)), ParamSpec("b", (48,))], 2, min_block_size=16)
SPEC = TableSpec(TABLE, DIM, ps.optim.Adagrad(lr=0.1), seed=3, init_scale=0.5)
DENSE_OPT = ps.optim.Adam(lr=0.01)
START = {"w": np.linspace(-1, 1, 256).astype(np.float32), "b": np.zeros(48, np.float32)}


def _servers(addresses, known: list[int], recovering: bool = False, first: int = 0) -> list[Child]:
    children = []
    for i, n in enumerate(known, start=first):
        env = ClusterEnv(role="server", server_id=i, servers=tuple(addresses[:n]), num_trainers=TRAINERS,
                         mode="sync", timeout=TIMEOUT, partitions=PARTITIONS, row_store="numpy",
                         recovering=recovering)
        children.append(Child(f"server {i}", [sys.executable, "-m", "paramshard", "server"],
                              child_environ(env)))
    return children


def _run(tmp_path, name: str, scale: bool = False, resume: str | None = None):
    """Train steps (resume: from the checkpoint's step on) on 2 servers (scale: a third joins at
    SCALE_AT); the chief checkpoints after each step of the window. Returns the final model,
    the move's record and the checkpoint root."""
    addresses = [f"127.0.0.1:{p}" for p in free_ports(3)]
    children = _servers(addresses, [2, 2, 3] if scale else [2, 2])
    routing = Routing.initial(PARTITIONS, addresses[:2])
    root = tmp_path / name
    reached, records = threading.Event(), []
    first = 0
    try:
        chief = ServerLinks(addresses[:2], timeout=TIMEOUT)     # open until the end (else trainer 0 is lost)
        chief.wait_ready(30)
        if resume is None:
            SparseClient(chief, 0, routing).register_sparse(SPEC)
            DenseClient(chief, PLAN, 0).register_dense(START, DENSE_OPT)
        else:
            ckpt = Checkpoint(resume)
            restore_checkpoint(chief, PLAN, DENSE_OPT, {TABLE: SPEC}, ckpt, routing=routing)
            first = ckpt.step

        def trainer(t: int):
            links = ServerLinks(addresses[:2], timeout=TIMEOUT)
            sparse = SparseClient(links, t, routing)
            dense = DenseClient(links, PLAN, t)
            dense.follow(sparse)
            values = {n: np.zeros_like(a) for n, a in START.items()}
            dense.pull_dense(values, first)
            for step in range(first, STEPS):
                rng = np.random.default_rng([t, step])        # a resume draws what the run drew
                ids = np.unique(rng.integers(0, 3000, 64).astype(np.uint64))
                rows = sparse.pull_sparse(TABLE, ids, DIM, min_version=step)
                grads = rows * np.float32(0.5) + rng.standard_normal(rows.shape).astype(np.float32)
                sparse.push_sparse(TABLE, ids, grads.astype(np.float32), step)
                dense.push_dense({n: (v * np.float32(0.5) + rng.standard_normal(v.shape).astype(np.float32))
                                  for n, v in values.items()}, step, out=values)
                if step == SCALE_AT:
                    reached.set()
                if t == 0 and resume is None and SCALE_AT <= step < SCALE_AT + WINDOW:
                    sparse.refresh_routing()      # as the backend does before a save
                    # Named by the steps done, as Trainer.step_count names them.
                    save_checkpoint(links, PLAN, {TABLE: SPEC}, root, step + 1,
                                    {"mode": "sync", "trainers": TRAINERS})
            links.close()
            return values

        def scaler():
            if not reached.wait(TIMEOUT):
                raise AssertionError("the trainers never reached the step to scale at")
            with ServerLinks(addresses[:2], timeout=TIMEOUT) as links:
                records.append(move_partitions(links, addresses, [0, 1, 2], page_rows=200))

        run_in_threads([lambda t=t: trainer(t) for t in range(TRAINERS)] + ([scaler] if scale else []), timeout=100)
        n = 3 if scale else 2
        with ServerLinks(addresses[:n], timeout=TIMEOUT) as reader:
            ids, values = SparseClient(reader, 0, Routing.initial(0, addresses[:n])).export_sparse(TABLE)
            router = SparseClient(reader, 0, routing)
            router.refresh_routing()
            final = DenseClient(reader, PLAN, 0)
            final.follow(router)
            dense_values = {k: np.zeros_like(a) for k, a in START.items()}
            final.pull_dense(dense_values, STEPS)
        rolled = _roll_back(chief, addresses, root, children) if scale else None
        chief.close()
        assert len(np.unique(ids)) == len(ids)
        return dict(zip(ids.tolist(), values)), dense_values, records, root, rolled
    finally:
        stop_all(children, grace=3)


def _roll_back(chief: ServerLinks, addresses, root, children: list) -> tuple[dict, dict]:
    """Servers 0 (it holds the routing) and 2 (the scale added it) are killed and started again
    in place, as the launcher does; the chief rolls the scaled job back to its latest checkpoint
    (every server reset, the checkpoint restored where the job's routing places rows and blocks
    now, the restarted servers told that routing). The model the servers then hold."""
    router = SparseClient(chief, 0, Routing.initial(PARTITIONS, addresses[:2]))
    router.refresh_routing()                 # before the failure: the trainer knows the routing
    for index, known in ((0, 2), (2, 3)):
        children[index].proc.kill()
        children[index].proc.wait(5)
        children[index] = _servers(addresses, [known], recovering=True, first=index)[0]
    _serving_restarted(addresses)
    roll_back(chief, PLAN, DENSE_OPT, {TABLE: SPEC}, root, True, 0, TIMEOUT, routing=router.routing)
    ids, _ = _export_all(chief, len(addresses))
    # Read as a trainer started now would: the routing server 0 gives, rows where it says.
    reader = SparseClient(chief, 0, Routing.initial(PARTITIONS, addresses[:2]))
    reader.refresh_routing()
    values = reader.pull_sparse(TABLE, ids, DIM, min_version=0)
    dense = DenseClient(chief, PLAN, 0)
    dense.follow(reader)
    got = {k: np.zeros_like(a) for k, a in START.items()}
    dense.pull_dense(got, 0)
    return dict(zip(ids.tolist(), values)), got


def _serving_restarted(addresses) -> None:
    """Servers 0 and 2 answer again (in epoch -1: restarted, nothing restored yet)."""
    import time
    deadline = time.monotonic() + 30
    for index in (0, 2):
        with ServerLinks([addresses[index]], timeout=2.0, who="probe") as probe:
            while True:
                try:
                    if probe.request(0, {"op": "hello"}, timeout=1.0)[0]["generation"] == -1:
                        break
                except ps.errors.ParamshardError:
                    pass
                assert time.monotonic() < deadline, f"server {index} did not start again"
                time.sleep(0.05)


def _export_all(links: ServerLinks, servers: int):
    parts = [links.request(s, {"op": "export_sparse", "table": TABLE})[1] for s in range(servers)]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _contents(path) -> tuple[dict, dict]:
    """A checkpoint's rows (id -> values and slots joined) and dense arrays by file. Rows never
    pushed are left out: in sync mode the other trainer's pull of the next step may make its new
    rows (their initial values) before or after the chief's snapshot, with or without a scale."""
    ckpt = Checkpoint(path)
    (table,) = ckpt.manifest["sparse"]
    parts = {p: ckpt.array(f) for p, f in table["files"].items()}
    ids = parts["ids"]
    assert len(np.unique(ids)) == len(ids), f"{path}: some rows are in the checkpoint twice"
    untouched = (parts["slot0"] == make_rule(SPEC.optimizer).init_slots((1, DIM))[0]).all(axis=1)
    row = np.concatenate([parts["values"], parts["slot0"]], axis=1)
    ids, row = ids[~untouched], row[~untouched]
    dense = {f: ckpt.array(f) for d in ckpt.manifest["dense"] for f in [d["files"]["values"], *d["files"]["slots"]]}
    return dict(zip(ids.tolist(), row)), dense


@pytest.mark.timeout(240)
def test_checkpoints_during_a_scale_hold_the_step_and_resume_on_fewer_servers(tmp_path):
    scaled_rows, scaled_dense, records, scaled_root, rolled = _run(tmp_path, "scaled", scale=True)
    plain_rows, plain_dense, _, plain_root, _ = _run(tmp_path, "plain")
    (record,) = records
    switch = record.switch_step
    assert record.partitions == PARTITIONS // 3 and record.blocks > 0, record
    assert switch is not None and SCALE_AT + 1 < switch < SCALE_AT + WINDOW, \
        f"the routing changed at step {switch}, outside the checkpoints' window"
    for step in range(SCALE_AT + 1, SCALE_AT + WINDOW + 1):
        rows, dense = _contents(scaled_root / step_dir_name(step))
        want_rows, want_dense = _contents(plain_root / step_dir_name(step))
        assert sorted(rows) == sorted(want_rows), f"step {step}: the checkpoint's ids differ with the scale"
        differ = [i for i in want_rows if not np.array_equal(rows[i], want_rows[i])]
        assert not differ, f"step {step} (switch {switch}): {len(differ)} rows differ, e.g. id {differ[0]}"
        for f in want_dense:
            np.testing.assert_array_equal(dense[f], want_dense[f], err_msg=f"step {step}: {f}")
    # A rollback after the scale (the latest checkpoint, back onto the 3 servers where the routing
    # places rows and blocks now) restores what the checkpoint holds.
    latest_rows, latest_dense = _contents(scaled_root / step_dir_name(SCALE_AT + WINDOW))
    rolled_rows, rolled_dense = rolled
    assert latest_rows and all(np.array_equal(rolled_rows[i], v[:DIM]) for i, v in latest_rows.items()), \
        "the rollback restored other rows"
    ckpt = Checkpoint(scaled_root / step_dir_name(SCALE_AT + WINDOW))
    for d in ckpt.manifest["dense"]:
        np.testing.assert_array_equal(rolled_dense[d["name"]], ckpt.array(d["files"]["values"]).reshape(-1))
    after = Checkpoint(scaled_root / step_dir_name(switch + 1))
    assert len(Routing.from_wire(after.manifest["routing"]).servers()) == 3, "taken under the 3-server routing"
    # Written by 3 servers (after the switch step), resumed on 2: the uninterrupted run's model.
    resumed_rows, resumed_dense, _, _, _ = _run(tmp_path, "resumed", resume=str(after.path))
    assert sorted(resumed_rows) == sorted(plain_rows) == sorted(scaled_rows)
    differ = [i for i in plain_rows if not (np.array_equal(resumed_rows[i], plain_rows[i])
                                            and np.array_equal(scaled_rows[i], plain_rows[i]))]
    assert not differ, f"{len(differ)} rows differ after the resume, e.g. id {differ[0]}"
    for k in plain_dense:
        np.testing.assert_array_equal(resumed_dense[k], plain_dense[k])
        np.testing.assert_array_equal(scaled_dense[k], plain_dense[k])
