from __future__ import annotations

from ..client.sparse import SparseClient
from ..env import ClusterEnv
from ..errors import ConfigError
from ..export import load_table, save_table
from ..transport.client import ServerLinks
from ..transport.security import Security

HELP = "merge every server's rows of a sparse table into one .npz file (or describe such a file)"
EXAMPLE = ("paramshard export --servers 10.0.0.1:6174,10.0.0.2:6174 --table deep --out deep.npz",
           "paramshard export --describe deep.npz")


def add_arguments(p) -> None:
    p.add_argument("--table", help="table name (the SparseEmbedding's name)")
    p.add_argument("--out", help="file to write (.npz)")
    p.add_argument("--servers", help="host:port,... of the running job (default: PARAMSHARD_SERVERS)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the servers (default 60)")
    p.add_argument("--describe", metavar="FILE", help="print what an exported file holds, then exit")


def run(args) -> int:
    if args.describe:
        t = load_table(args.describe)
        print(f"table {t.name!r}: {len(t.ids):,} rows of dim {t.dim} (seed {t.seed}, init scale {t.init_scale})")
        return 0
    if not args.table or not args.out:
        raise ConfigError("give --table NAME and --out FILE (or --describe FILE)")
    environ = ClusterEnv.from_environ()
    servers = args.servers.split(",") if args.servers else list(environ.servers)
    if not servers:
        raise ConfigError("no servers: pass --servers host:port,... or set PARAMSHARD_SERVERS")
    ClusterEnv(role=None, servers=tuple(servers))   # validates host:port
    with ServerLinks(servers, args.timeout, who="export", security=Security.from_env(environ)) as links:
        ids, values, meta = SparseClient(links, trainer_id=-1).export_sparse(args.table, with_meta=True)
    save_table(args.out, meta, ids, values)
    print(f"wrote {len(ids):,} rows of table {args.table!r} (dim {meta['dim']}) to {args.out}")
    return 0
