"""client/dense.py in an elastic job: requests go where the routing's block map says, carry its
version, and those refused as ``moved`` go again, split by the newer routing, to the new owners;
the values come back into the right places. Fake links and router, no sockets."""
import numpy as np

from paramshard.client.dense import DenseClient
from paramshard.placement.partitions import Routing
from paramshard.placement.sharding import ParamSpec, make_plan

PLAN = make_plan([ParamSpec("w", (8, 2)), ParamSpec("b", (6,))], 2, min_block_size=4)
SIZES = {b.name: b.size for b in PLAN.blocks}


class FakeLinks:
    epoch = 0
    timeout = 1.0

    def __init__(self, owners: dict, refuse: set):
        self.owners, self.refuse, self.sent = owners, refuse, []

    def __len__(self):
        return 3

    def is_retired(self, server):
        return False

    def request_list(self, requests, timeout=None):
        self.sent.append(requests)
        replies = []
        for server, header, arrays in requests:
            if server in self.refuse:
                replies.append(None)        # ServerLinks.collect: refused as moved
                continue
            assert all(self.owners[n] == server for n in header["names"]), (server, header["names"])
            # The server's values: each block's value is its gradient plus 100, so the oracle is simple
            # (a pull carries no gradient: 100).
            if header["op"] == "pull_dense":
                arrays = [np.zeros(SIZES[n], np.float32) for n in header["names"]]
            replies.append(({"versions": [1] * len(arrays)}, [a + 100 for a in arrays]))
        return replies


class FakeRouter:
    def __init__(self, routing, newer):
        self.routing, self.newer, self.asked = routing, newer, []

    def catch_up_with_links(self):
        pass

    def newer_than_refused(self, refused):
        sent = max(h["routing"] for _, h, _ in refused)
        if self.routing.version <= sent:
            self.asked.append(sent)
            self.routing = self.newer
        return self.routing


def test_refused_blocks_go_to_their_new_owner_and_values_land_in_place():
    base = Routing.initial(16, ["a:1", "b:2"])
    before = {b.name: b.server for b in PLAN.blocks}
    moved = dict(before)
    on_one = sorted(n for n, s in before.items() if s == 1)
    moved[on_one[0]] = 2
    newer = base.moved_to(base.owners, version=2, addresses=["a:1", "b:2", "c:3"], blocks=moved)
    links = FakeLinks(before, refuse={1})
    dense = DenseClient(links, PLAN, 0)
    router = FakeRouter(base.moved_to(base.owners, blocks=before), newer)
    dense.follow(router)
    grads = {"w": np.arange(16, dtype=np.float32), "b": np.arange(6, dtype=np.float32) - 10}
    out = {n: np.zeros_like(g) for n, g in grads.items()}
    links.owners = before            # the servers as the trainer last knew them: server 1 refuses
    first = dense.push_requests(grads, 0, want_values=True)
    assert all(h["routing"] == 1 for _, h, _ in first)
    replies = links.request_list(first)
    assert replies[[s for s, _, _ in first].index(1)] is None
    links.owners, links.refuse = moved, set()
    requests, replies = dense.settle(replies, first)
    assert router.asked == [1] and dense.resent == 1
    again = links.sent[-1]
    assert {s for s, _, _ in again} == {2} and all(h["routing"] == 2 for _, h, _ in again)
    assert [h["names"] for s, h, _ in again if s == 2] == [[on_one[0]]]
    dense.scatter(requests, replies, out)
    for n in grads:
        np.testing.assert_array_equal(out[n], grads[n] + 100)
    # From now on requests go straight to the new owners.
    assert {n for s, h, _ in dense.push_requests(grads, 1, False) if s == 2 for n in h["names"]} == {on_one[0]}


class RouterLinks(FakeLinks):
    """FakeLinks whose server 0 also answers routing_get (with ``truth``), counting them."""

    def __init__(self, owners, refuse, truth):
        super().__init__(owners, refuse)
        self.truth, self.routing_gets = truth, 0

    def request(self, server, header, arrays=()):
        assert header["op"] == "routing_get" and server == 0
        self.routing_gets += 1
        return {"routing": self.truth.to_wire()}, []


def test_a_push_refused_under_an_older_routing_goes_again_under_the_newest_known():
    """Issue 29: a dense push sent under routing 1 is in flight; a sparse refusal meanwhile fetched
    routing 2 (the move's last) and the next pull follows it; then the push is refused. It goes
    again under routing 2 without asking server 0 for a routing newer than 2 (none comes)."""
    from paramshard.client.sparse import SparseClient
    base = Routing.initial(16, ["a:1", "b:2"])
    before = {b.name: b.server for b in PLAN.blocks}
    moved = dict(before)
    on_one = sorted(n for n, s in before.items() if s == 1)
    moved[on_one[0]] = 2
    old = base.moved_to(base.owners, addresses=["a:1", "b:2", "c:3"], blocks=before)
    final = old.moved_to(old.owners, blocks=moved)
    links = RouterLinks(before, {1}, final)
    links.timeout = 0.5
    router = SparseClient(links, 0, old)
    dense = DenseClient(links, PLAN, 0)
    dense.follow(router)
    grads = {"w": np.arange(16, dtype=np.float32), "b": np.arange(6, dtype=np.float32) - 10}
    push = dense.push_requests(grads, 0, want_values=True)
    replies = links.request_list(push)                     # in flight; refused by server 1
    router.refresh_routing(newer_than=1)                   # a sparse request's refusal learnt routing 2
    links.owners, links.refuse = moved, set()
    following = dense.push_requests(grads, 1, want_values=False)     # the next step goes by routing 2
    assert {h["routing"] for _, h, _ in following} == {2}
    assert links.routing_gets == 1
    requests, replies = dense.settle(replies, push)
    assert links.routing_gets == 1, "routing 2 is newer than the push's 1: nothing to ask server 0"
    again = links.sent[-1]
    assert {s for s, _, _ in again} == {2} and all(h["routing"] == 2 for _, h, _ in again)
    out = {n: np.zeros_like(g) for n, g in grads.items()}
    dense.scatter(requests, replies, out)
    for n in grads:
        np.testing.assert_array_equal(out[n], grads[n] + 100)


def test_a_bounded_reply_saying_follow_becomes_a_gated_pull_at_the_blocks_owners():
    """Issue 29: a move froze blocks while the bounded-staleness reply to their push waited on the
    old owner; the reply says ``follow`` (the push is applied: it is not sent again). The trainer
    pulls the blocks of that request from their owners under the newer routing, gated at the
    same step, and the values land in place; the other replies stay as they came."""
    base = Routing.initial(16, ["a:1", "b:2"])
    before = {b.name: b.server for b in PLAN.blocks}
    moved = dict(before)
    on_one = sorted(n for n, s in before.items() if s == 1)
    moved[on_one[0]] = 2
    newer = base.moved_to(base.owners, version=2, addresses=["a:1", "b:2", "c:3"], blocks=moved)
    links = FakeLinks(moved, refuse=set())
    dense = DenseClient(links, PLAN, 0)
    router = FakeRouter(base.moved_to(base.owners, blocks=before), newer)
    dense.follow(router)
    grads = {"w": np.arange(16, dtype=np.float32), "b": np.arange(6, dtype=np.float32) - 10}
    push = dense.push_requests(grads, 4, want_values=True, resume_step=5)
    replies = [({"staleness": 0, "follow": 5}, []) if s == 1 else
               ({"versions": [1] * len(a), "staleness": 0}, [x + 100 for x in a]) for s, _, a in push]
    requests, replies = dense.catch_up(push, replies)
    pulls = links.sent[-1]
    assert router.asked == [1], "the pushed routing is not newer than the reply's: server 0 is asked"
    assert all(h["op"] == "pull_dense" and h["resume_step"] == 5 and h["routing"] == 2 for _, h, _ in pulls)
    pulled = sorted(n for _, h, _ in pulls for n in h["names"])
    assert pulled == sorted(n for n, s in before.items() if s == 1), "exactly the blocks of the follow reply"
    assert all(moved[n] == s for s, h, _ in pulls for n in h["names"]), "each block from its new owner"
    assert [h["op"] for _, h, _ in requests].count("push_dense") == len(push) - 1
    # FakeLinks answers a pull with zeros + 100 (no gradient): the pulled blocks hold 100.
    out = {n: np.full_like(g, -1) for n, g in grads.items()}
    dense.scatter(requests, replies, out)
    for block in PLAN.blocks:
        got = out[block.param][block.offset:block.offset + block.size]
        want = (grads[block.param][block.offset:block.offset + block.size] + 100 if before[block.name] != 1
                else np.full(block.size, 100, np.float32))
        np.testing.assert_array_equal(got, want)
