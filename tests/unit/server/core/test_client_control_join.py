"""client/control.join: a joiner of an elastic job takes the step after the highest step in
progress of every server, and asks again when a server moved past it meanwhile (fake links:
each server's step in progress is scripted; no sockets, no sleep)."""
import numpy as np
import pytest

import paramshard as ps
from paramshard.client import control
from paramshard.errors import DeadlineExceeded
from paramshard.server.core.in_process import LocalLinks
from paramshard.server.core.parameter_server import ParameterServer


class Links:
    """Servers whose steps in progress move as ``moves`` says, one entry per request round."""
    def __init__(self, moves):
        self.moves = list(moves)
        self.joined = {}

    retired = ()

    def __len__(self):
        return len(self.moves[0])

    def live(self):
        return [s for s in range(len(self)) if s not in self.retired]

    def request_many(self, requests, timeout=None):
        steps = self.moves[0] if len(self.moves) == 1 else self.moves.pop(0)
        replies = {}
        for s, (header, _) in requests.items():
            first = header.get("first_step")
            if first is None:
                replies[s] = ({"version": steps[s]}, [])
            else:
                ok = first > steps[s]
                if ok:
                    self.joined[s] = first
                replies[s] = ({"version": steps[s], "joined": ok}, [])
        return replies


def test_the_joiner_starts_after_the_highest_step_in_progress():
    links = Links([[4, 5]])
    assert control.join(links, 2, timeout=5.0) == 6 and links.joined == {0: 6, 1: 6}


def test_a_server_that_moved_on_meanwhile_makes_it_ask_again():
    # probe: steps 4 and 5; the join of 6 finds server 1 at 6 already; the next round joins 7.
    links = Links([[4, 5], [4, 6], [5, 6], [5, 6]])
    assert control.join(links, 2, timeout=5.0) == 7 and links.joined == {0: 7, 1: 7}


def test_a_server_a_scale_removed_is_not_asked():
    """Issue 29: a removed server (retired in the links) may have exited: join and leave skip it."""
    links = Links([[5, 9, 3]])
    links.retired = (1,)
    asked = []
    request_many = links.request_many
    links.request_many = lambda requests, timeout=None: asked.append(sorted(requests)) or request_many(requests)
    assert control.join(links, 2, timeout=1.0) == 6
    assert links.joined == {0: 6, 2: 6} and asked == [[0, 2], [0, 2]]
    control.leave(links, 2)
    assert asked[-1] == [0, 2]


def test_steps_that_always_outrun_the_join_end_at_the_deadline():
    class Racing(Links):
        def request_many(self, requests, timeout=None):
            self.moves = [[s + 2 for s in self.moves[0]]]      # two steps further each round
            return super().request_many(requests, timeout)
    now = [0.0]

    def clock():
        now[0] += 1.0
        return now[0]
    with pytest.raises(DeadlineExceeded, match=r"could not join within 3 s: servers \[0\]"):
        control.join(Racing([[0]]), 2, timeout=3.0, clock=clock)


def test_join_on_an_elastic_server_in_this_process():
    server = ParameterServer(0, None, num_trainers=3, timeout=5.0, min_trainers=1)
    links = LocalLinks(server, timeout=5.0)
    links.request(0, {"op": "register_dense", "trainer": 0, "names": ["w"], "optimizer": ps.optim.SGD(lr=1.0).to_wire(),
                      "plan_fingerprint": 7}, [np.zeros(2, np.float32)])
    assert control.join(links, 2, timeout=5.0) == 1
    assert server.membership.first_step == {2: 1} and server.membership.required_for(0) == {0, 1}


def test_a_joiner_learns_server_0s_barrier_counts_and_goes_on_from_them():
    server = ParameterServer(0, None, num_trainers=3, timeout=5.0, min_trainers=1)
    links = LocalLinks(server, timeout=5.0)
    server.membership.connection_lost(2)            # slot 2 is empty, as a scale-up finds it
    first = links.submit([(0, {"op": "barrier", "trainer": 0, "name": "epoch-end", "count": 1}, ())])
    control.barrier(links, 1, "epoch-end", 1)        # trainer 1 completes it
    links.collect(first)
    counts = {"stale": 9}
    control.join(links, 2, timeout=5.0, barrier_counts=counts)
    assert counts == {"epoch-end": 1}                # the job's count, not zero
    assert server.membership.live >= {2}
