"""client/checkpoint.gather_table in an elastic job: a server a scale removed holds no rows and
may have exited (the launcher stops it once every trainer routes without it), so it is not asked;
the rows of the servers that serve are all there (the CTR app's best-model snapshot at an epoch
end failed on the stopped server after a scale 3 -> 2)."""
import numpy as np

from paramshard.client.checkpoint import gather_table
from paramshard.transport.links import Requests


class Servers(Requests):
    """Three servers, the third retired: the first two answer snapshot_sparse with their rows."""

    def __init__(self):
        self.rows = {0: np.array([1, 3, 5], np.uint64), 1: np.array([2, 4], np.uint64)}

    def __len__(self):
        return 3

    def is_retired(self, server):
        return server == 2

    def request_list(self, requests, timeout=None):
        out = []
        for server, header, _ in requests:
            assert server in self.rows, f"asked server {server}, which a scale removed"
            ids = self.rows[server][header["start"]:header["start"] + header["count"]]
            out.append(({"parts": ["ids", "values"], "version": 4, "evicted": 0, "rows": len(self.rows[server])},
                        [ids, ids.astype(np.float32).reshape(-1, 1)]))
        return out


def test_a_retired_server_is_not_asked_and_every_serving_servers_rows_come():
    parts, version, evicted, scale = gather_table(Servers(), "t")
    assert sorted(parts["ids"].tolist()) == [1, 2, 3, 4, 5] and version == 4 and evicted == 0 and scale == 1.0
    np.testing.assert_array_equal(parts["values"][:, 0], parts["ids"].astype(np.float32))
