"""`paramshard plan`: print the block plan every process will compute, with server loads."""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import shlex
import sys
from pathlib import Path
from typing import Any

from paramshard.env import DISPATCHERS, ClusterEnv
from paramshard.errors import ConfigError
from paramshard.placement.sharding import ParamSpec, ShardPlan, make_plan, parse_shape

HELP = "show how dense parameters are split into blocks and placed on servers"
EXAMPLE = ("paramshard plan --servers 2 --param fc1.weight=784x512 --param fc1.bias=512",
           "paramshard plan --servers 2 --model mymodels:Net      # shapes from mymodels.Net()",
           "paramshard plan --servers 2 --script train.py --script-args='--dim 32'")
# above this max/mean server load, the table suggests --dispatch balanced
BALANCED_HINT_RATIO = 1.2


def add_arguments(p):
    p.add_argument("--servers", type=int, required=True, metavar="N", help="number of parameter servers")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--param", action="append", default=[], dest="params", metavar="NAME=SHAPE",
                        help="a dense parameter, e.g. fc.weight=1000x10 (repeat for more)")
    source.add_argument("--model", metavar="MODULE:CLASS",
                        help="take the shapes from MODULE.CLASS() (imported from the current directory "
                             "or the Python path); SparseEmbedding tables hold no dense parameters")
    source.add_argument("--script", metavar="FILE",
                        help="run the training script until it constructs ps.Trainer(model, ...) and take "
                             "that model's shapes (ps.init() starts no server here; anything the script "
                             "does before the Trainer, e.g. writing data, it does)")
    p.add_argument("--script-args", default="", metavar="ARGS",
                   help="arguments for --script, as one shell-quoted string; write --script-args='--dim 32' "
                        "when they start with a dash")
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
    if args.script_args and not args.script:
        raise ConfigError("--script-args needs --script FILE")
    if args.model:
        specs = _model_params(args.model)
    elif args.script:
        specs = _script_params(args.script, shlex.split(args.script_args), args)
    else:
        specs = _params(args.params)
    plan = make_plan(specs, args.servers, args.dispatch, **_block_sizes(args))
    hint = _balanced_hint(plan, specs, args)
    if args.json:
        print(json.dumps(plan.to_json()))
        if hint:
            print(hint, file=sys.stderr)   # stdout stays one JSON document
    else:
        _print_tables(plan)
        if hint:
            print(hint)
    return 0


def _balanced_hint(plan: ShardPlan, specs: list[ParamSpec], args) -> str | None:
    """A note when the load is uneven: try --dispatch balanced (with the max/mean it
    would give), or, when blocks are too coarse for any placement, smaller blocks."""
    ratio = plan.load_ratio()
    if ratio <= BALANCED_HINT_RATIO:
        return None
    note = f"note: load max/mean {ratio:.3f} is above {BALANCED_HINT_RATIO}"
    if plan.dispatch != "balanced":
        min_block = args.min_block_size if args.min_block_size and args.dispatch != "legacy_v1" else None
        balanced = make_plan(specs, args.servers, "balanced", **({"min_block_size": min_block} if min_block else {}))
        if balanced.load_ratio() < ratio:
            return f"{note}: try --dispatch balanced (load max/mean {balanced.load_ratio():.3f})"
    return f"{note}: the blocks are too few or too uneven to spread; try a smaller --min-block-size"


def _dense_specs(model) -> list[ParamSpec]:
    """What the Trainer would serve: its dense parameters, minus any under a SparseEmbedding."""
    from paramshard.trainer.sparse_embedding import SparseEmbedding
    from paramshard.trainer.trainer import Trainer

    sparse = [name + "." for name, m in model.named_modules() if isinstance(m, SparseEmbedding)]
    specs = [ParamSpec(name, tuple(p.shape)) for name, p in Trainer._dense_parameters(model)
             if not any(name.startswith(prefix) for prefix in sparse)]
    if not specs:
        raise ConfigError(f"{type(model).__name__} has no dense parameters to place on servers")
    return specs


def _model_params(target: str) -> list[ParamSpec]:
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"--model {target!r} is not MODULE:CLASS, e.g. --model mymodels:Net")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())      # as `python -m` would: modules of the current directory
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--model {target}: cannot import {module_name} ({exc})") from exc
    factory: Any = module                    # then what MODULE:A.B names: a class or a function
    for part in attr.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise ConfigError(f"--model {target}: {module_name} has no {attr}")
    import torch
    try:
        model = factory()
    except TypeError as exc:
        raise ConfigError(f"--model {target}: {attr}() failed ({exc}); it must build the model with no "
                          "arguments (point --model at a function that does, or use --script)") from exc
    except Exception as exc:
        raise ConfigError(f"--model {target}: {attr}() failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"--model {target}: {attr}() returned {type(model).__name__}, not a torch.nn.Module")
    return _dense_specs(model)


class _ModelFound(BaseException):
    """Raised by the stand-in Trainer to stop the script; BaseException so a script's
    `except Exception` does not swallow it."""

    def __init__(self, model):
        super().__init__()
        self.model = model


def _script_params(script: str, script_args: list[str], args) -> list[ParamSpec]:
    path = Path(script)
    if not path.is_file():
        raise ConfigError(f"--script {script}: no such file")
    import paramshard
    import paramshard.trainer as torch_package
    from paramshard import runtime
    from paramshard.trainer import trainer as trainer_module

    servers = tuple(f"127.0.0.1:{6174 + i}" for i in range(args.servers))
    env = ClusterEnv(role="trainer", servers=servers, num_trainers=1, trainer_id=0, dispatch=args.dispatch)

    def init(env_arg=None):      # no server is started, no process exits as a server rank
        return env

    def stop_at_trainer(model, *a, **kw):
        raise _ModelFound(model)

    saved_argv, saved_path = sys.argv[:], sys.path[:]
    patches = [(trainer_module, "Trainer", stop_at_trainer), (torch_package, "Trainer", stop_at_trainer),
               (runtime, "init", init),
               (runtime, "current", init), (paramshard, "init", init)]
    originals = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    model = None
    try:
        for obj, name, value in patches:
            setattr(obj, name, value)
        sys.argv = [str(path), *script_args]
        sys.path.insert(0, str(path.resolve().parent))
        with contextlib.redirect_stdout(sys.stderr):     # the script's prints must not mix into the plan
            runpy.run_path(str(path), run_name="__main__")
    except _ModelFound as found:
        model = found.model
    except SystemExit as exc:
        raise ConfigError(f"--script {script} exited ({exc.code}) before constructing ps.Trainer") from None
    except Exception as exc:
        raise ConfigError(f"--script {script} failed before constructing ps.Trainer: "
                          f"{type(exc).__name__}: {exc}") from exc
    finally:
        for obj, name, value in originals:
            setattr(obj, name, value)
        sys.argv, sys.path[:] = saved_argv, saved_path
    if model is None:
        raise ConfigError(f"--script {script} finished without constructing ps.Trainer(model, ...)")
    return _dense_specs(model)     # after the finally: the real Trainer is back


def _params(items: list[str]) -> list[ParamSpec]:
    if not items:
        raise ConfigError("no parameters: pass at least one --param NAME=SHAPE, e.g. --param fc.weight=1000x10 "
                          "(or --model MODULE:CLASS, or --script FILE)")
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

    from paramshard.observe.live.terminal import is_live_terminal
    # Styles only for a terminal someone watches: a rank under mpirun sees a pseudo-terminal.
    console = Console(force_terminal=is_live_terminal(sys.stdout))
    console.print(blocks)
    console.print(servers)
    console.print(f"load max/mean: {plan.load_ratio():.3f} (1.000 is perfectly even)")
