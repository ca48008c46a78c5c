"""`paramshard serve`: a serving replica of a training job's delta directory (paramshard/serving/)."""
from __future__ import annotations

import signal
import sys
import threading

HELP = ("serve a model while it learns: load a delta directory's latest snapshots, follow its new deltas and "
        "answer predictions over HTTP (POST /predict, /predict/batch; GET /health, /metrics)")
EXAMPLE = ("paramshard serve runs/deltas --port 8500",
           "paramshard serve runs/deltas --port 8500 --memory-budget 4GB --tier-dir /scratch/serve")


def add_arguments(p) -> None:
    p.add_argument("model_dir", metavar="MODEL_DIR", help="the delta directory a training job publishes to "
                   "(model.pt, blocks.json, server-S/{snapshot,delta}-SEQ.psd)")
    p.add_argument("--port", type=int, required=True, metavar="P", help="HTTP port (0: any free one, printed)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on; anything but loopback serves the "
                   "model to the network (there is no authentication)")
    p.add_argument("--row-store", choices=("compiled", "numpy"), default="compiled",
                   help="the row store that holds the tables (the servers' stores)")
    p.add_argument("--memory-budget", metavar="SIZE", help="keep each copy of each table within SIZE of RAM "
                   "(e.g. 4GB), the rest in files under --tier-dir (the compiled store's disk tier); the replica "
                   "holds two copies")
    p.add_argument("--tier-dir", metavar="DIR", help="where a --memory-budget's files go (default: a temporary "
                     "directory)")
    p.add_argument("--poll", type=float, default=1.0, metavar="S", help="seconds between looks for new files")
    p.add_argument("--unknown", choices=("initial", "zeros"), default="initial",
                   help="what an id without a row reads: its initial row (as in training's evaluation) or zeros")
    p.add_argument("--max-body", type=int, default=4 << 20, metavar="BYTES", help="largest request body")
    p.add_argument("--threads", type=int, default=1, metavar="N", help="torch threads per forward: a request's "
                   "few rows gain nothing from more, and requests run in threads of their own (measured: a 100-row "
                   "DeepFM forward 1.7 ms with 1, several times that with 2 on a busy 2-core machine)")
    p.add_argument("--status-every", type=float, default=5.0, metavar="S", help="seconds between two writes of "
                   "this replica's status file (MODEL_DIR/replicas/HOST-PORT.json: its version and freshness, for "
                   "`paramshard report`); removed when it stops")
    p.add_argument("--grace", type=float, default=30.0, metavar="S", help="longest wait for lookups of the "
                   "previous version before a change is put off to the next poll")


def run(args) -> int:
    from paramshard.budgets import parse_budget
    from paramshard.errors import ConfigError
    from paramshard.log import configure
    from paramshard.serving.http import ServingFront
    from paramshard.serving.live_table import StoreChoice
    from paramshard.serving.replica import Replica
    from paramshard.serving.status_writer import StatusWriter

    if args.poll <= 0 or args.grace <= 0 or args.status_every <= 0:
        raise ConfigError(f"--poll {args.poll} / --grace {args.grace} / --status-every {args.status_every}: "
                          f"seconds, > 0")
    if args.threads < 1:
        raise ConfigError(f"--threads {args.threads}: at least 1")
    if args.max_body < 1024:
        raise ConfigError(f"--max-body {args.max_body}: at least 1024 bytes")
    # Its lines on stderr at PARAMSHARD_LOG_LEVEL (default INFO): a start again from the snapshots
    # (a server restarted, a gap a snapshot covers) is said, not only the warnings.
    configure("serve")
    import torch
    torch.set_num_threads(args.threads)
    store = StoreChoice(args.row_store, parse_budget(args.memory_budget, "--memory-budget"), args.tier_dir)
    replica = Replica(args.model_dir, store, args.unknown, args.grace).start()
    front = ServingFront(replica, args.host, args.port, args.max_body)
    stop = threading.Event()
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: stop.set())
    follower = threading.Thread(target=replica.follow, args=(args.poll,), name="serve-follow", daemon=True)
    follower.start()
    front.start()
    status = StatusWriter(replica, front.port, front.url, args.status_every).start()
    print(f"serving {args.model_dir} at {front.url} (version {replica.version}); Ctrl-C stops", flush=True)
    if not args.host.startswith("127.") and args.host not in ("localhost", "::1"):
        print(f"warning: --host {args.host}: predictions are served to the network, without authentication",
              file=sys.stderr, flush=True)
    try:
        # In slices: the signal handler runs on this thread between them, however the wait was
        # resumed (one SIGTERM after a SIGSTOP/SIGCONT was not enough with an unbounded wait).
        while not stop.wait(0.5):
            pass
    finally:
        replica.stop()
        status.close()
        front.close()
        follower.join(timeout=args.grace + 10)
        replica.close()
    return 0
