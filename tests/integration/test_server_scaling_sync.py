"""Sync mode across server scales: the sync oracle holds (issue 24 item 3, issue 29 item 2).

Two sync trainers train a table (Adagrad, gradients that depend on the rows pulled) and dense
parameters (Adam, gradients that depend on the values) for a fixed number of steps, once on 2
servers and once while servers change: a third server takes a third of the partitions and its
share of the dense blocks (and, in the second test, gives them back: 2 -> 3 -> 2). Every row and
every dense value must end bit-equal, and the dense values each step's push reply carried too.
The routing changes at one step for both trainers (migrate_switch), between the completion of
the step before and any push of that step.

Both scale 2 -> 3 -> 2 (a later move's new owners must not hold the steps before its switch
for the switch of the move before). The second test trains through StepClient with the next step's rows prefetched, as
``trainer.prefetching`` does: a pull sent under the old routing for a step past the switch is
refused, and must be sent again under the routing the trainer learnt meanwhile, not wait for
a newer one that never comes (a sync job deadlocked so two steps after the switch).
"""
from __future__ import annotations

import functools
import sys
import threading

import numpy as np
import pytest

import paramshard as ps
from paramshard.client.dense import DenseClient
from paramshard.client.sparse import SparseClient, TableSpec
from paramshard.client.step import StepClient
from paramshard.env import ClusterEnv
from paramshard.launch.engines.local import child_environ
from paramshard.launch.engines.ports import free_ports
from paramshard.launch.engines.processes import Child, stop_all
from paramshard.launch.elastic.server_scaling import move_partitions
from paramshard.placement.partitions import Routing
from paramshard.placement.sharding import ParamSpec, make_plan
from paramshard.transport.links import ServerLinks
from tests.conftest import run_in_threads

# Starts, stops or kills server processes of its own: `make test` only, not `make check`.
pytestmark = pytest.mark.processes

# The trainers' links wait longer than the servers: a trainer stuck waiting (for a routing, say)
# shows as the servers giving up on its step, an error, not as a pause that then goes on.
TRAINERS, PARTITIONS, TIMEOUT, TRAINER_TIMEOUT, SCALE_AT = 2, 64, 20.0, 40.0, 5
TABLE, DIM = "emb", 8
PLAN = make_plan([ParamSpec("w", (64, 4)), ParamSpec("b", (48,))], 2, min_block_size=16)
START = {"w": np.linspace(-1, 1, 256).astype(np.float32), "b": np.zeros(48, np.float32)}


def _batches(t: int, steps: int) -> list[np.ndarray]:
    rng = np.random.default_rng(t)
    return [np.unique(rng.integers(0, 3000, 64).astype(np.uint64)) for _ in range(steps)]


def _train(steps: int, moves: tuple = (), prefetch: bool = False) -> tuple[dict, list, list]:
    """Train ``steps`` steps; once the trainers reach SCALE_AT, ``moves`` (each a list of servers)
    one after the other. Returns the rows, the MoveRecords and each trainer's dense values per step."""
    third = any(2 in servers for servers in moves)
    addresses = [f"127.0.0.1:{p}" for p in free_ports(3)]
    children = []
    for i, known in ((0, 2), (1, 2)) + (((2, 3),) if third else ()):
        env = ClusterEnv(role="server", server_id=i, servers=tuple(addresses[:known]), num_trainers=TRAINERS,
                         mode="sync", timeout=TIMEOUT, partitions=PARTITIONS, row_store="numpy")
        children.append(Child(f"server {i}", [sys.executable, "-m", "paramshard", "server"],
                              child_environ(env)))
    spec = TableSpec(TABLE, DIM, ps.optim.Adagrad(lr=0.1), seed=3, init_scale=0.5)
    routing = Routing.initial(PARTITIONS, addresses[:2])
    moved, progress = threading.Event(), threading.Condition()
    done = [0] * TRAINERS           # steps each trainer completed
    records = []
    try:
        # Open until the end: a connection that named trainer 0 and closes would make it "lost".
        chief = ServerLinks(addresses[:2], timeout=TIMEOUT)
        chief.wait_ready(30)
        SparseClient(chief, 0, routing).register_sparse(spec)
        DenseClient(chief, PLAN, 0).register_dense(START, ps.optim.Adam(lr=0.01))

        def trainer(t: int):
            links = ServerLinks(addresses[:2], timeout=TRAINER_TIMEOUT)
            sparse = SparseClient(links, t, routing)
            dense = DenseClient(links, PLAN, t)
            dense.follow(sparse)
            client = StepClient(links, dense, sparse)
            values = {n: np.zeros_like(a) for n, a in START.items()}
            dense.pull_dense(values, 0)
            seen = []           # the values each step's push reply carried
            batches, rng = _batches(t, steps), np.random.default_rng(100 + t)
            for step, ids in enumerate(batches):
                if prefetch and step + 1 < steps:      # as trainer.prefetching: before this step's forward
                    client.prefetch(TABLE, batches[step + 1], step + 1)
                rows = client.rows(TABLE, ids, DIM, step) if prefetch else \
                    sparse.pull_sparse(TABLE, ids, DIM, min_version=step)
                grads = (rows * np.float32(0.5) + rng.standard_normal(rows.shape).astype(np.float32))
                dense_grads = {n: (v * np.float32(0.5) + rng.standard_normal(v.shape).astype(np.float32))
                               for n, v in values.items()}
                if prefetch:
                    client.push(dense_grads, [(TABLE, ids, grads.astype(np.float32))], step, values)
                else:
                    sparse.push_sparse(TABLE, ids, grads.astype(np.float32), step)
                    dense.push_dense(dense_grads, step, out=values)
                seen.append(np.concatenate([values["w"], values["b"]]))
                with progress:
                    done[t] = step + 1
                    progress.notify_all()
                if moves and step > SCALE_AT and not moved.is_set():
                    threading.Event().wait(0.02 if step % 2 else 0)    # pace the steps while rows move
            assert moved.is_set() or not moves, f"trainer {t}: the moves outlasted the {steps} steps"
            if prefetch:
                assert client.stats["prefetch_hits"] > steps // 2, client.stats
            links.close()
            return (sparse.resent, dense.resent), np.stack(seen)

        def reach(step: int, after: str) -> None:
            with progress:
                if not progress.wait_for(lambda: min(done) >= step, TIMEOUT):
                    raise AssertionError(f"the trainers stopped at steps {done} {after}, short of step {step}")

        def scaler():
            reach(SCALE_AT, "before any move")
            with ServerLinks(addresses[:2], timeout=TIMEOUT) as links:
                for servers in moves:
                    # Small pages: the copy takes many round trips, so the trainers step between a
                    # move's expect and its arm (where a later move's new owner once held them all).
                    records.append(move_partitions(links, addresses, servers, page_rows=50))
                    # Training goes on past the switch (a trainer once froze two steps after it).
                    reach(records[-1].switch_step + 10, f"after the switch at step {records[-1].switch_step}")
            moved.set()

        resent = run_in_threads([lambda t=t: trainer(t) for t in range(TRAINERS)] + ([scaler] if moves else []),
                                timeout=100)
        final_servers = moves[-1] if moves else [0, 1]
        with ServerLinks(addresses[:2], timeout=TIMEOUT) as reader:
            # By the routing server 0 holds: a server the scale removed exits once every trainer let
            # go of it, and each row is read from its partition's owner.
            router = SparseClient(reader, 0, routing)
            ids, values = router.export_sparse(TABLE)
            assert router.routing.servers() == list(final_servers), router.routing
            final = DenseClient(reader, PLAN, 0)
            final.follow(router)
            dense_values = {n: np.zeros_like(a) for n, a in START.items()}
            final.pull_dense(dense_values, steps)
        chief.close()
        if moves:
            assert sum(r[0] for r, _ in resent[:TRAINERS]) > 0, "no request was refused as moved: the move was not live"
            # Dense requests follow the routing the sparse pull of the switch step fetched (its refusal
            # comes first in a step), so they are rarely refused themselves: the async test sees that.
        assert len(np.unique(ids)) == len(ids)
        np.testing.assert_array_equal(resent[0][1][-1], np.concatenate([dense_values["w"], dense_values["b"]]))
        return dict(zip(ids.tolist(), values)), records, [seen for _, seen in resent[:TRAINERS]]
    finally:
        stop_all(children, grace=3)


def _assert_bit_equal(scaled, plain) -> None:
    (scaled_rows, _, scaled_dense), (plain_rows, _, plain_dense) = scaled, plain
    for t, (a, b) in enumerate(zip(scaled_dense, plain_dense)):
        differ = np.flatnonzero((a != b).any(axis=1))
        assert not len(differ), f"trainer {t}: the dense values of steps {differ[:5].tolist()} differ with the scale"
    assert sorted(scaled_rows) == sorted(plain_rows)
    differ = [i for i in plain_rows if not np.array_equal(plain_rows[i], scaled_rows[i])]
    assert not differ, f"{len(differ)} of {len(plain_rows)} rows differ, e.g. id {differ[0]}: " \
                       f"{scaled_rows[differ[0]].tolist()} vs {plain_rows[differ[0]].tolist()}"


STEPS = 200


@functools.cache
def _unscaled() -> tuple:
    """The oracle: the same steps on 2 servers, rows pulled when the forward needs them."""
    return _train(STEPS)


def _check_moves(records: list) -> None:
    up, down = records
    assert up.partitions == down.partitions == PARTITIONS // 3 and up.blocks > 0 and down.blocks > 0, records
    assert up.switch_step is not None and down.switch_step is not None, records


@pytest.mark.timeout(150)
def test_sync_rows_are_bit_equal_with_and_without_a_scale_2_3_2():
    scaled = _train(STEPS, moves=([0, 1, 2], [0, 1]))
    _check_moves(scaled[1])
    _assert_bit_equal(scaled, _unscaled())


@pytest.mark.timeout(150)
def test_sync_with_prefetching_scales_2_3_2_bit_equal_to_an_unscaled_run():
    scaled = _train(STEPS, moves=([0, 1, 2], [0, 1]), prefetch=True)
    _check_moves(scaled[1])
    _assert_bit_equal(scaled, _unscaled())
