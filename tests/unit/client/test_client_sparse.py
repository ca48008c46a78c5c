"""client/sparse.py in an elastic job: what a move refused is split again under the new routing and
sent again, only that, and rows come back in the order asked (fake servers, no sockets)."""
from __future__ import annotations

import numpy as np
import pytest

from paramshard.client.sparse import SparseClient
from paramshard.errors import DeadlineExceeded
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

    def is_retired(self, server):
        return False

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


class CountingServers(FakeServers):
    """FakeServers whose server 0 counts the routing_get requests it answers."""

    def __init__(self, truth: Routing, timeout: float = 5.0):
        super().__init__(truth)
        self.timeout = timeout
        self.routing_gets = 0

    def request(self, server, header, arrays=()):
        self.routing_gets += 1
        return super().request(server, header, arrays)


def test_a_push_refused_after_a_pull_learnt_the_final_routing_goes_again_at_once():
    """Issue 29: a push sent under routing 1 is in flight; the step's pull is refused and fetches
    routing 2 (the move's last); then the push is refused. It goes again under routing 2 without
    asking server 0 for a routing newer than 2, which never comes (the trainer stalled a timeout)."""
    old = Routing.initial(P, ["a:1", "b:2"])
    middle = old.moved_to(old.owners, addresses=["a:1", "b:2", "c:3"])
    final = middle.moved_to(rebalance(old.owners, [0, 1, 2]))
    links = CountingServers(final, timeout=0.5)
    client = SparseClient(links, 3, middle)
    ids = np.arange(0, 300, dtype=np.uint64)
    push = client.push_requests("t", ids, np.ones((len(ids), DIM), np.float32), step=7)
    assert {h["routing"] for _, h, _ in push} == {1}
    pushed_replies = links.request_list(push)            # in flight: refused by the old owners
    assert None in pushed_replies
    pulled = client.pull_sparse("t", ids[::-1].copy(), DIM)     # refused, then settled under routing 2
    np.testing.assert_array_equal(pulled[:, 0], ids[::-1].astype(np.float32))
    assert client.routing.version == 2 and links.routing_gets == 1
    client.settle(pushed_replies, push)
    assert links.routing_gets == 1, "the push was sent under routing 1 and routing 2 is known: nothing to ask"
    pushes = [(s, sent) for s, op, sent in links.sent if op == "push_sparse"]
    assert len(pushes) > len(push), "the refused parts went again"
    applied = [i for s, sent in pushes if not (final.servers_of(np.array(sent, np.uint64)) != s).any() for i in sent]
    assert sorted(applied) == ids.tolist(), "each id's push applied once"


def test_a_refusal_under_the_routing_server_0_still_holds_fails_fast_naming_the_server():
    """Issue 29: server 1 refuses ids server 0's routing gives it (a move broke half-way): the push
    fails within the patience, naming the server and the routing version, not after 101 timeouts."""
    routing = Routing.initial(P, ["a:1", "b:2"]).moved_to(Routing.initial(P, ["a:1", "b:2"]).owners)
    links = CountingServers(routing, timeout=0.05)
    links.request_list = lambda requests: [None if s == 1 else ({}, []) for s, _, _ in requests]
    client = SparseClient(links, 4, routing)
    ids = np.arange(0, 50, dtype=np.uint64)
    with pytest.raises(DeadlineExceeded) as caught:
        client.push_sparse("t", ids, np.ones((len(ids), DIM), np.float32), step=0)
    message = str(caught.value)
    assert "trainer 4: server 1 refused its push_sparse of table 't' as moved" in message
    assert "routing version 1" in message and "stop it and start it again" in message


def test_a_joiner_learns_a_routing_with_a_retired_server_without_connecting_to_it():
    """Issue 29: after 2 -> 3 -> 2 the routing names server 2 retired (""); a trainer that never knew
    server 2 learns it and keeps a placeholder for index 2, connecting nothing (it died on 'tcp://')."""
    first = Routing.initial(P, ["a:1", "b:2"])
    up = first.moved_to(rebalance(first.owners, [0, 1, 2]), addresses=["a:1", "b:2", "c:3"])
    down = up.moved_to(rebalance(up.owners, [0, 1]), addresses=["a:1", "b:2", ""])
    links = RetiringServers(down)
    client = SparseClient(links, 5, first)
    client.refresh_routing()
    assert links.added == [""] and links.retired == {2} and client.routing.version == 2
    ids = np.arange(0, 400, dtype=np.uint64)
    rows = client.pull_sparse("t", ids, DIM)
    np.testing.assert_array_equal(rows[:, 0], ids.astype(np.float32))
    client.push_sparse("t", ids, np.ones((len(ids), DIM), np.float32), step=0)
    assert all(s in (0, 1) for s, _, _ in links.sent), "nothing goes to the retired server"
    # A trainer that knew server 2 lets it go when it learns the routing that retires it.
    knew = RetiringServers(down, count=3)
    SparseClient(knew, 6, up).refresh_routing()
    assert knew.added == [] and knew.retired == {2}


class RetiringServers(FakeServers):
    """FakeServers with ServerLinks' placeholders for retired servers."""

    def __init__(self, truth: Routing, count: int = 2):
        super().__init__(truth)
        self.count, self.retired = count, set()

    def add_server(self, address):
        index = super().add_server(address)
        if not address:
            self.retired.add(index)
        return index

    def is_retired(self, index):
        return index in self.retired

    def retire(self, index):
        self.retired.add(index)

    def request_list(self, requests):
        assert not any(s in self.retired for s, _, _ in requests), "a request to a retired server"
        return super().request_list(requests)


class SwitchReArmed(FakeServers):
    """Sync, a move's switch armed at a step on server 1, then moved to a later step there (server
    2 had said "too close"), while server 0 publishes no newer routing: server 1 refuses a push of
    that step under the old routing ``refusals`` times, then takes it."""

    def __init__(self, truth: Routing, refusals: int):
        super().__init__(truth)
        self.refusals = refusals

    def request_list(self, requests):
        replies = []
        for server, header, arrays in requests:
            self.sent.append((server, header["op"], arrays[0].tolist()))
            if server == 1 and self.refusals:
                self.refusals -= 1
                replies.append(None)
            else:
                replies.append(({}, []))
        return replies


def test_a_refusal_while_server_0_has_no_newer_routing_is_sent_again_as_it_was():
    """Issue 29 (a sync switch armed on some servers, then re-armed later when another said "too
    close"): the trainer resends the refused push under the same routing, and it is taken; before,
    it waited for a newer routing that never came and failed after moved_patience."""
    routing = Routing.initial(P, ["a:1", "b:2"])
    links = SwitchReArmed(routing, refusals=3)
    client = SparseClient(links, 0, routing)
    client.moved_patience = 5.0
    ids = np.arange(64, dtype=np.uint64)
    client.push_sparse("t", ids, np.ones((64, DIM), np.float32), step=7)
    to_1 = [sent for s, op, sent in links.sent if s == 1]
    assert len(to_1) == 4 and all(sent == to_1[0] for sent in to_1), "the same push, four times"
    assert links.refusals == 0 and client.routing.version == 0


def test_a_refusal_that_lasts_still_fails_within_the_patience():
    routing = Routing.initial(P, ["a:1", "b:2"])
    links = SwitchReArmed(routing, refusals=10 ** 6)
    client = SparseClient(links, 0, routing)
    client.moved_patience = 0.2          # refused for ever: any patience ends the same way
    with pytest.raises(DeadlineExceeded, match="server 1 refused its push_sparse of table 't' as moved"):
        client.push_sparse("t", np.arange(64, dtype=np.uint64), np.ones((64, DIM), np.float32), step=7)


class HoldingBoth(FakeServers):
    """Mid-move: both servers hold rows of the moving partitions (the new owner took the copied
    pages in, the old one has not dropped them), each with its own values."""

    def request_many(self, requests):
        out = {}
        for server, (header, _) in requests.items():
            assert header["op"] == "export_sparse"
            ids = np.arange(0, 300, dtype=np.uint64)
            out[server] = ({"dim": DIM, "seed": 1, "init_scale": 0.1, "optimizer": {}},
                           [ids, np.full((len(ids), DIM), server, np.float32)])
        return out


def test_an_export_takes_each_row_from_the_server_owning_its_partition():
    first = Routing.initial(P, ["a:1", "b:2"])
    moved = first.moved_to(rebalance(first.owners, [1]))           # every partition to server 1
    client = SparseClient(HoldingBoth(moved), -1, first)
    ids, values = client.export_sparse("t")
    np.testing.assert_array_equal(ids, np.arange(0, 300, dtype=np.uint64))
    assert (values == 1).all(), "server 0's copies are not the job's rows any more"



def test_a_server_another_user_of_the_links_retired_makes_the_routing_catch_up_first():
    """A checkpoint's save follows server 0's routing on the trainer's own links (client/checkpoint.py
    job_routing) and lets go of a server a scale removed, while this client still routes by the
    routing before: its next pull or push goes by the newer one, not to the retired server (the
    links would refuse it: "no server of the job any more")."""
    two = Routing.initial(P, ["a:1", "b:2"])
    three = two.moved_to(rebalance(two.owners, [0, 1, 2]), addresses=["a:1", "b:2", "c:3"])
    without_1 = three.moved_to(rebalance(three.owners, [0, 2]), addresses=["a:1", "", "c:3"])
    links = RetiringServers(without_1, count=3)
    client = SparseClient(links, 0, three)
    links.retire(1)                                   # as job_routing's follow_addresses does
    ids = np.arange(100, 400, dtype=np.uint64)
    rows = client.pull_sparse("t", ids, DIM)
    np.testing.assert_array_equal(rows[:, 0], ids.astype(np.float32))
    assert client.routing.version == without_1.version
    client.push_sparse("t", ids, np.ones((len(ids), DIM), np.float32), step=0)
    assert 1 not in {s for s, _, _ in links.sent}
