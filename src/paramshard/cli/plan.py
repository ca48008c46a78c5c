"""`paramshard plan`: print the block plan every process will compute, with server loads."""
from __future__ import annotations

import json

from ..env import DISPATCHERS
from ..errors import ConfigError
from ..sharding import ParamSpec, ShardPlan, make_plan, parse_shape

HELP = "show how dense parameters are split into blocks and placed on servers"


def add_arguments(p):
    p.add_argument("--servers", type=int, required=True, metavar="N", help="number of parameter servers")
    p.add_argument("--param", action="append", default=[], dest="params", metavar="NAME=SHAPE",
                   help="a dense parameter, e.g. fc.weight=1000x10 (repeat for more)")
    p.add_argument("--dispatch", choices=DISPATCHERS, default="round_robin",
                   help="block placement policy (default round_robin)")
    # None means "not given": legacy_v1 then sizes blocks automatically, the others use 8192
    p.add_argument("--min-block-size", type=int, default=None, metavar="M",
                   help="smallest block in elements (default 8192); for legacy_v1, the block size")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")


def run(args) -> int:
    # name the flags here; make_plan would name its own arguments
    if args.servers < 1:
        raise ConfigError(f"--servers {args.servers}: need at least 1 server")
    if args.min_block_size is not None and args.min_block_size < 1:
        raise ConfigError(f"--min-block-size {args.min_block_size}: must be >= 1 element")
    plan = make_plan(_params(args.params), args.servers, args.dispatch, **_block_sizes(args))
    if args.json:
        print(json.dumps(plan.to_json()))
    else:
        _print_tables(plan)
    return 0


def _params(items: list[str]) -> list[ParamSpec]:
    if not items:
        raise ConfigError("no parameters: pass at least one --param NAME=SHAPE, e.g. --param fc.weight=1000x10")
    specs = []
    for item in items:
        name, sep, shape = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--param {item!r} is not NAME=SHAPE, e.g. fc.weight=1000x10")
        specs.append(ParamSpec(name.strip(), parse_shape(shape)))
    return specs


def _block_sizes(args) -> dict:
    if args.dispatch == "legacy_v1":
        return {"legacy_block_size": args.min_block_size}
    return {} if args.min_block_size is None else {"min_block_size": args.min_block_size}


def _print_tables(plan: ShardPlan) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    # box.SIMPLE: light rules that stay readable when piped into a log file
    blocks = Table(title=f"{len(plan.blocks)} blocks on {plan.num_servers} servers ({plan.dispatch})",
                   box=box.SIMPLE)
    for col in ("block", "offset", "size", "shape", "server"):
        blocks.add_column(col, justify="left" if col == "block" else "right")
    for b in plan.blocks:
        shape = "x".join(map(str, plan.block_shape(b)))
        blocks.add_row(b.name, str(b.offset), str(b.size), shape, str(b.server))

    servers = Table(title="server load (float32)", box=box.SIMPLE)
    for col in ("server", "blocks", "elements", "MiB", "share"):
        servers.add_column(col, justify="right")
    elements = plan.server_elements()
    total = sum(elements)
    for s, n in enumerate(elements):
        share = n / total if total else 0.0
        servers.add_row(str(s), str(len(plan.for_server(s))), str(n), f"{n * 4 / 2**20:.3f}", f"{share:.1%}")

    console = Console()
    console.print(blocks)
    console.print(servers)
    console.print(f"load max/mean: {plan.load_ratio():.3f} (1.000 is perfectly even)")
