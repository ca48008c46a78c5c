"""One trainer backend per mode, chosen once from the mode; what each mode answers."""
import numpy as np
import pytest

from paramshard.client.step import PipelineStats
from paramshard.env import ClusterEnv
from paramshard.mode import Mode
from paramshard.trainer.backends import backend_class
from paramshard.trainer.backends.collective import CollectiveBackend
from paramshard.trainer.backends.geo import GeoBackend
from paramshard.trainer.backends.hybrid import HybridBackend
from paramshard.trainer.backends.servers import ServerBackend


@pytest.mark.parametrize("mode,expected", [(Mode.SYNC, ServerBackend), (Mode.ASYNC, ServerBackend),
                                           (Mode.COLLECTIVE, CollectiveBackend), (Mode.HYBRID, HybridBackend),
                                           (Mode.GEO, GeoBackend)])
def test_each_mode_has_its_backend(mode, expected):
    assert backend_class(mode) is expected
    assert backend_class(str(mode).upper()) is expected      # a mode named in text is parsed


def test_every_mode_has_a_backend():
    assert {backend_class(m) for m in Mode} == {ServerBackend, CollectiveBackend, HybridBackend, GeoBackend}


class FakeSteps:
    """What a ServerBackend asks of its StepClient, recorded."""
    def __init__(self):
        self.stats, self.calls, self.last_staleness = PipelineStats(), [], 3

    def __getattr__(self, name):
        return lambda *args, **kwargs: self.calls.append((name, args, kwargs))


def server_backend(mode):
    env = ClusterEnv(role="trainer", mode=mode, servers=("127.0.0.1:1",))
    return ServerBackend(env, links=None, plan=None, dense=None, sparse=None, steps=FakeSteps())


def test_sync_rows_wait_for_every_earlier_step_and_async_rows_do_not():
    sync, async_ = server_backend(Mode.SYNC), server_backend(Mode.ASYNC)
    assert [sync.row_version(s) for s in (0, 7)] == [0, 7]
    assert [async_.row_version(s) for s in (0, 7)] == [0, 0]
    assert sync.step_of_version(5) == 5 and async_.step_of_version(5) is None
    sync.rows("t", np.arange(3, dtype=np.uint64), 4, 7, True)
    name, args, _ = sync.steps.calls[-1]
    assert name == "rows" and args[3] == 7


def test_only_async_asks_for_rows_after_the_push_before():
    current = np.array([1, 2], np.uint64)
    assert server_backend(Mode.SYNC).fresh_after(current, True) is None
    async_ = server_backend(Mode.ASYNC)
    assert async_.fresh_after(current, True) is current
    assert async_.fresh_after(None, True) is True            # the ids of the step before are unknown
    assert async_.fresh_after(current, False) is None        # fresh_rows=False: fetched ahead anyway


def test_server_backend_pushes_dense_and_tables_in_one_step():
    backend = server_backend(Mode.ASYNC)
    grads, values = {"w": np.ones(2, np.float32)}, {"w": np.zeros(2, np.float32)}
    backend.push(grads, [], 4, values)
    assert backend.steps.calls[-1] == ("push", (grads, [], 4, values), {})
    assert backend.staleness() == 3


class RecordingDense:
    def __init__(self):
        self.pushed = []

    def push_dense(self, grads, step, out):
        self.pushed.append(step)


def test_hybrid_updates_the_replica_while_the_tables_push_is_in_flight():
    env = ClusterEnv(role="trainer", mode=Mode.HYBRID, servers=("127.0.0.1:1",))
    backend = HybridBackend(env, links=None, plan=None, dense=None, sparse=None, steps=FakeSteps())
    backend._dense_sync = RecordingDense()
    backend.push({"w": np.ones(2, np.float32)}, [("t", "ids", "grads")], 2, {"w": np.zeros(2, np.float32)})
    name, args, kwargs = backend.steps.calls[-1]
    assert name == "push" and args == ({}, [("t", "ids", "grads")], 2, {})     # no dense on the servers
    assert backend._dense_sync.pushed == []
    kwargs["while_waiting"]()                 # what the step client runs while the push is out
    assert backend._dense_sync.pushed == [2]


def test_collective_backend_counts_steps_and_has_no_servers():
    env = ClusterEnv(role="trainer", mode=Mode.COLLECTIVE)
    backend = CollectiveBackend(env, data_parallel=None, dense_sync=RecordingDense())
    backend.push({"w": np.ones(1, np.float32)}, [], 0, {"w": np.zeros(1, np.float32)})
    assert backend.dense_sync.pushed == [0] and backend.stats["steps"] == 1
    assert backend.links is backend.steps is backend.plan is None
    assert backend.server_stats() == [] and backend.staleness() is None and backend.row_version(4) == 4
