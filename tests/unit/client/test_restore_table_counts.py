"""client/checkpoint._restore_table: a table's rows and its admission counts (counted_ids, counts)
go back to the servers that own them, every id once, the counts with the first page of each server."""
import numpy as np

from paramshard.client import checkpoint
from paramshard.placement.partitions import Routing


class Recorder:
    def __init__(self):
        self.sent = []

    def request_list(self, requests, timeout=None):
        self.sent += requests
        return [({"ok": True}, []) for _ in requests]


def _restore(parts, monkeypatch, page_rows=2):
    monkeypatch.setattr(checkpoint, "SPARSE_PAGE_ROWS", page_rows)
    links = Recorder()
    routing = Routing.initial(8, ("a:1", "b:2"))
    entry = {"name": "t", "version": 3}
    checkpoint._restore_table(links, entry, parts, 0, routing)
    return links.sent, routing


def _sent(sent, part):
    return [(server, arrays[header["parts"].index(part)].tolist()) for server, header, arrays in sent
            if part in header["parts"]]


def test_rows_and_counts_each_reach_their_owner_once(monkeypatch):
    ids = np.arange(1, 8, dtype=np.uint64)
    counted = np.array([11, 12, 13, 14, 15], np.uint64)
    parts = {"ids": ids, "values": ids.astype(np.float32).reshape(-1, 1),
             "counted_ids": counted, "counts": counted.astype(np.int64) - 10}
    sent, routing = _restore(parts, monkeypatch)
    rows = [(s, i) for s, page in _sent(sent, "ids") for i in page]
    assert sorted(i for _, i in rows) == ids.tolist()
    assert all(s == routing.servers_of(np.array([i], np.uint64))[0] for s, i in rows)
    counts = [(s, i) for s, page in _sent(sent, "counted_ids") for i in page]
    assert sorted(i for _, i in counts) == counted.tolist()
    assert all(s == routing.servers_of(np.array([i], np.uint64))[0] for s, i in counts)
    for server, page in _sent(sent, "counts"):       # each count with its id
        ids_there = dict(_sent(sent, "counted_ids"))[server]
        assert page == [i - 10 for i in ids_there]
    firsts = {}
    for server, header, _ in sent:
        firsts.setdefault(server, header)
    assert all(("counted_ids" in h["parts"]) == (h is firsts[s]) for s, h, _ in sent)


def test_a_table_without_counts_sends_rows_only(monkeypatch):
    ids = np.arange(1, 6, dtype=np.uint64)
    sent, _ = _restore({"ids": ids, "values": ids.astype(np.float32).reshape(-1, 1)}, monkeypatch)
    assert sorted(i for _, page in _sent(sent, "ids") for i in page) == ids.tolist()
    assert not _sent(sent, "counted_ids") and not _sent(sent, "counts")
