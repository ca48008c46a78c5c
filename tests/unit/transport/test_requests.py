"""transport/requests.py: the blocking calls every client offers, built on submit and collect."""
import pytest

from paramshard.transport.requests import Requests, Ticket


class Echo(Requests):
    """Three server indices, server 1 retired; a reply names its server and echoes the header."""

    def __init__(self):
        self.sent = []

    def __len__(self):
        return 3

    def is_retired(self, server):
        return server == 1

    def submit(self, requests, timeout=None):
        self.sent.append((list(requests), timeout))
        ticket = Ticket(len(requests), wait=0.0, deadline=0.0)
        ticket.results = [({"server": s, **header}, list(arrays)) for s, header, arrays in requests]
        return ticket

    def collect(self, ticket):
        return ticket.results


def test_every_request_goes_out_before_any_reply_is_awaited_and_replies_keep_their_order():
    links = Echo()
    replies = links.request_list([(2, {"op": "a"}, ()), (0, {"op": "b"}, ())], timeout=5.0)
    assert [h for h, _ in replies] == [{"server": 2, "op": "a"}, {"server": 0, "op": "b"}]
    assert len(links.sent) == 1 and links.sent[0][1] == 5.0           # one fan-out, one deadline


def test_request_many_answers_by_server_and_request_one_reply():
    links = Echo()
    out = links.request_many({2: ({"op": "x"}, ["a"]), 0: ({"op": "y"}, [])})
    assert out == {2: ({"server": 2, "op": "x"}, ["a"]), 0: ({"server": 0, "op": "y"}, [])}
    assert links.request(0, {"op": "z"}) == ({"server": 0, "op": "z"}, [])


def test_live_leaves_retired_servers_out():
    assert Echo().live() == [0, 2]


def test_a_ticket_is_done_when_nothing_is_pending_or_an_error_came():
    ticket = Ticket(2, wait=1.0, deadline=10.0)
    assert ticket.done
    ticket.pending[7] = (0, 1, "pull_sparse")
    assert not ticket.done
    ticket.error = RuntimeError("server 1 gone")
    assert ticket.done


def test_the_base_class_names_what_a_client_must_provide():
    with pytest.raises(NotImplementedError):
        Requests().submit([])
