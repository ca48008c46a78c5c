"""`paramshard export`: a run's, a checkpoint's or a live job's model or sparse table as one file."""
from __future__ import annotations

from paramshard.client.sparse import SparseClient
from paramshard.env import ClusterEnv
from paramshard.errors import ConfigError
from paramshard.export import load_table, save_table
from paramshard.transport.links import ServerLinks
from paramshard.transport.security import Security

HELP = ("write a run's or checkpoint's model to one file (what export-model writes), or one sparse table to "
        "a .npz file from a checkpoint or from every server of a running job (or describe such a file)")
EXAMPLE = ("paramshard export runs/20261123-181500-job-ab12cd34ef56 --out model.pt",
           "paramshard export runs/ckpt --table deep --out deep.npz",
           "paramshard export --servers 10.0.0.1:6174,10.0.0.2:6174 --table deep --out deep.npz",
           "paramshard export --describe deep.npz")


def add_arguments(p) -> None:
    p.add_argument("source", nargs="?", metavar="SOURCE",
                   help="a run directory, a checkpoint directory (its latest checkpoint) or a step-NNNNNNNN "
                        "directory; without it, the tables of the running job at --servers")
    p.add_argument("--table", help="table name (the SparseEmbedding's name); with SOURCE: write only that table")
    p.add_argument("--out", help="file to write: the model file (.pt), or the table's .npz with --table")
    p.add_argument("--servers", help="host:port,... of the running job (default: PARAMSHARD_SERVERS)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the servers (default 60)")
    p.add_argument("--describe", metavar="FILE", help="print what an exported table file holds, then exit")


def run(args) -> int:
    if args.describe:
        t = load_table(args.describe)
        print(f"table {t.name!r}: {len(t.ids):,} rows of dim {t.dim} (seed {t.seed}, init scale {t.init_scale})")
        return 0
    if args.source is not None:
        return _from_checkpoint(args)
    if not args.table or not args.out:
        raise ConfigError("give SOURCE --out FILE (a run or checkpoint directory), --table NAME --out FILE "
                          "(a running job's table), or --describe FILE")
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


def _from_checkpoint(args) -> int:
    from paramshard.inference.export_sources import checkpoint_table, find_checkpoint

    if args.servers:
        raise ConfigError("give SOURCE (a run or checkpoint directory) or --servers (a running job), not both")
    if not args.out:
        raise ConfigError(f"export {args.source}: give --out FILE")
    ckpt = find_checkpoint(args.source)
    if args.table:
        ids, values, meta = checkpoint_table(ckpt, args.table)
        save_table(args.out, meta, ids, values)
        print(f"wrote {len(ids):,} rows of table {args.table!r} (dim {meta['dim']}) of {ckpt.path} to {args.out}")
        return 0
    from paramshard.cli.models.export_model import describe_written
    from paramshard.inference.serving import export_model     # torch: imported only here

    print(describe_written(export_model(ckpt.path, args.out), args.out))
    return 0
