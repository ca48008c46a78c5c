"""A server under an address-space limit (RLIMIT_AS, `ulimit -v`, as some clusters set it).

Each sparse table used to reserve its whole row limit as address space when registered
(42 GB for a dim-4 table, 545 GB for dim 64): under a limit the first table took most of it
and the server soon died of a libzmq abort (a thread stack it could not map). Now a table
maps what it holds (server/storage/kernels/arena.py), and one that asks for more than the limit
has room for is refused by name, while the server goes on serving the others."""
import numpy as np
import pytest

import paramshard as ps
from paramshard.client.sparse import SparseClient, TableSpec
from paramshard.errors import RemoteError
from paramshard.transport.links import ServerLinks

# Starts, stops or kills server processes of its own: `make test` only, not `make check`.
pytestmark = pytest.mark.processes

LIMIT = 6 << 30
TABLES = 50
DIMS = (4, 8, 16, 32, 64)
IDS = 2000


@pytest.mark.timeout(300)
def test_a_server_under_6_gib_serves_50_tables_and_refuses_one_that_does_not_fit(cluster):
    c = cluster(servers=1, trainers=1, mode="async", timeout=30.0, address_space=LIMIT)
    links = ServerLinks(list(c.base.servers), timeout=30.0)
    try:
        links.wait_ready(60)
        sparse = SparseClient(links, 0)
        specs = []
        for t in range(TABLES):
            dim = DIMS[t % len(DIMS)]
            # SGD at lr 1 from zero rows: a row is minus the sum of its gradients, exactly. Every
            # fifth table keeps Adagrad state too (a row's bytes doubled) and reserves rows up front.
            adagrad = t % 5 == 4
            optimizer = ps.optim.Adagrad(lr=1.0) if adagrad else ps.optim.SGD(lr=1.0)
            specs.append(TableSpec(f"t{t}", dim, optimizer, init_scale=0.0, capacity=100_000 if adagrad else 0))
            sparse.register_sparse(specs[-1])
        rng = np.random.default_rng(5)
        sums = {}
        for rounds in range(3):              # rows made, then grown past their first mapping, then updated
            for spec in specs:
                ids = np.unique(rng.integers(1, 2**63, IDS, dtype=np.uint64)) if rounds < 2 else \
                    np.sort(np.array(list(sums[spec.name]), np.uint64))[:IDS]
                rows = sparse.pull_sparse(spec.name, ids, spec.dim)
                assert rows.shape == (len(ids), spec.dim)
                grads = rng.integers(-4, 5, (len(ids), spec.dim)).astype(np.float32)
                sparse.push_sparse(spec.name, ids, grads, 0)
                if spec.optimizer.kind == "sgd":
                    table = sums.setdefault(spec.name, {})
                    for i, g in zip(ids.tolist(), grads):
                        table[i] = table.get(i, 0) + g
                else:
                    sums.setdefault(spec.name, {}).update((i, None) for i in ids.tolist())
        # A table reserving 100M rows (x 1.02 + 1024: the client's margin) of dim 64 with Adagrad, 520 bytes
    # a row: 53 GB, past 6 GiB.
        big = TableSpec("too_big", 64, ps.optim.Adagrad(lr=1.0), capacity=100_000_000)
        with pytest.raises(RemoteError) as refused:
            sparse.register_sparse(big)
        message = str(refused.value)
        assert "table 'too_big'" in message and "address space" in message, message
        assert "102001024 rows" in message and "GiB" in message and "6.0 GiB limit" in message, message
        # ... and the server goes on: every SGD table reads back its exact sums.
        for spec in specs:
            if spec.optimizer.kind != "sgd":
                continue
            table = sums[spec.name]
            ids = np.array(sorted(table), np.uint64)
            rows = sparse.pull_sparse(spec.name, ids, spec.dim)
            np.testing.assert_array_equal(rows, -np.stack([table[i] for i in ids.tolist()]))
        assert c.children[0].proc.poll() is None, "the server died"
    finally:
        links.close()
