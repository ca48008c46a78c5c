"""server/core/in_process.py over a ParameterServer without a socket (bind=None): requests are direct
calls, a deferred answer waits on the server's one waiting list until a later request completes
it, the hooks run as on the socket path, and a wait nothing can complete is an error."""
import numpy as np
import pytest

import paramshard as ps
from paramshard.errors import DeadlineExceeded, RemoteError
from paramshard.server.core.in_process import LocalLinks
from paramshard.server.core.parameter_server import ParameterServer


def dense_job(trainers=2):
    server = ParameterServer(0, None, num_trainers=trainers, timeout=5.0)
    links = LocalLinks(server, timeout=5.0)
    links.request(0, {"op": "register_dense", "trainer": 0, "names": ["w"], "optimizer": ps.optim.SGD(lr=1.0).to_wire(),
                      "plan_fingerprint": 7}, [np.zeros(2, np.float32)])
    return server, links


def push(trainer, grad, reply_values=True):
    return (0, {"op": "push_dense", "trainer": trainer, "step": 0, "names": ["w"], "reply_values": reply_values},
            [np.full(2, grad, np.float32)])


def test_a_deferred_reply_is_answered_by_the_request_that_completes_the_step():
    server, links = dense_job()
    first = links.submit([push(0, 1.0)])
    assert first.pending and len(server.waiting) == 1            # waits for trainer 1's push
    second = links.submit([push(1, 3.0)])
    (header, (values,)), = links.collect(first)
    np.testing.assert_array_equal(values, [-2.0, -2.0])            # the mean of both gradients
    assert header["versions"] == [1] and links.collect(second)[0][1][0].tolist() == [-2.0, -2.0]
    assert len(server.waiting) == 0 and server.stats["deferred_answered"] == 2


def test_a_wait_nothing_in_this_process_can_complete_is_an_error_naming_it():
    server, links = dense_job()
    ticket = links.submit([push(0, 1.0)])
    with pytest.raises(DeadlineExceeded, match=r"cannot answer \['push_dense'\]: step 1 of 1 blocks is not complete"):
        links.collect(ticket)
    assert len(server.waiting) == 0                                 # forgotten with its ticket


def test_the_hooks_run_as_on_the_socket_path():
    server, links = dense_job(trainers=1)
    with pytest.raises(RemoteError, match="push_dense of epoch 4 refused: server 0 is in epoch 0"):
        links.request(0, {**push(0, 1.0)[1], "epoch": 4}, push(0, 1.0)[2])
    links.request(0, {"op": "reset", "trainer": 0, "epoch": 1})
    assert server.generation == 1 and server.snapshot_stats()["dense_blocks"] == 0
