"""client/sparse.py in an elastic job: what a move refused is split again under the new routing and
sent again, only that, and rows come back in the order asked (fake servers, no sockets)."""
from __future__ import annotations

import numpy as np

from paramshard.client.sparse import SparseClient
from paramshard.placement.partitions import Routing, rebalance

P, DIM = 64, 2


class FakeServers:
    """Servers that own what ``truth`` says; a request touching anything else is refused (None)."""

    def __init__(self, truth: Routing):
        self.truth, self.timeout, self.epoch = truth, 5.0, 0
        self.count = 2
        self.sent: list[tuple[int, str, list]] = []
        self.added: list[str] = []

    def __len__(self):
        return self.count

    def add_server(self, address):
        self.added.append(address)
        self.count += 1
        return self.count - 1

    def request(self, server, header, arrays=()):
        assert header["op"] == "routing_get" and server == 0
        return {"routing": self.truth.to_wire()}, []

    def request_list(self, requests):
        replies = []
        for server, header, arrays in requests:
            ids = arrays[0]
            self.sent.append((server, header["op"], ids.tolist()))
            if (self.truth.servers_of(ids) != server).any():
                replies.append(None)
            elif header["op"] == "pull_sparse":
                replies.append(({}, [np.repeat(ids.astype(np.float32)[:, None], DIM, axis=1)]))
            else:
                replies.append(({}, []))
        return replies


def test_refused_parts_go_again_to_the_new_owners_in_order():
    old = Routing.initial(P, ["a:1", "b:2"])
    new = old.moved_to(rebalance(old.owners, [0, 1, 2]), addresses=["a:1", "b:2", "c:3"])
    links = FakeServers(new)
    client = SparseClient(links, 0, old)
    ids = np.arange(100, 400, dtype=np.uint64)
    rows = client.pull_sparse("t", ids, DIM)
    np.testing.assert_array_equal(rows[:, 0], ids.astype(np.float32))       # every id's own row, in order
    assert links.added == ["c:3"] and client.routing.version == 1
    first = [s for s in links.sent[:2]]
    again = links.sent[2:]
    accepted_first = {s for s, _, sent in first if not (new.servers_of(np.array(sent, np.uint64)) != s).any()}
    assert {s for s, _, _ in again} <= {0, 1, 2} and not ({s for s, _, _ in again} & accepted_first)
    moved = ids[new.servers_of(ids) != old.servers_of(ids)]
    assert set(moved.tolist()) <= {i for s, _, sent in again if s == 2 for i in sent}
    refused_first = [sent for s, _, sent in first if s not in accepted_first]
    assert sum(len(sent) for _, _, sent in again) == sum(len(sent) for sent in refused_first), \
        "only the refused requests are sent again"


def test_a_refused_push_reaches_every_server_of_the_routing_once():
    old = Routing.initial(P, ["a:1", "b:2"])
    new = old.moved_to(rebalance(old.owners, [0, 1, 2]), addresses=["a:1", "b:2", "c:3"])
    links = FakeServers(new)
    client = SparseClient(links, 0, old)
    ids = np.arange(10, dtype=np.uint64)
    client.push_sparse("t", ids, np.ones((10, DIM), np.float32), step=0)
    pushed = [(s, sent) for s, op, sent in links.sent if op == "push_sparse"]
    settled = pushed[2:]
    assert sorted(s for s, _ in settled) == sorted(set(s for s, _ in settled)), "one push a server"
    final = {}
    for (s, sent), ok in zip(pushed, [not (new.servers_of(np.array(x, np.uint64)) != s).any() for s, x in pushed]):
        if ok:
            final.setdefault(s, []).extend(sent)
    assert sorted(i for sent in final.values() for i in sent) == ids.tolist(), "each id applied once"
    assert 2 in {s for s, _ in settled}
