from __future__ import annotations

import argparse

from ..env import ClusterEnv, DEFAULT_MIN_BLOCK_SIZE, DEFAULT_TIMEOUT, DISPATCHERS, MODES
from ..launch.local import LaunchConfig, LocalLauncher
from ..log import configure

HELP = "run a training script as a local cluster (servers + trainers on this machine)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--servers", type=int, default=1, help="number of parameter servers (default 1)")
    p.add_argument("--trainers", type=int, default=1, help="number of trainers (default 1)")
    p.add_argument("--mode", choices=MODES, default="sync", help="sync: barrier per step; async: apply on arrival")
    p.add_argument("--dispatch", choices=DISPATCHERS, default="round_robin", help="how blocks go to servers")
    p.add_argument("--min-block-size", type=int, default=DEFAULT_MIN_BLOCK_SIZE,
                   help=f"smallest dense block, in elements (default {DEFAULT_MIN_BLOCK_SIZE})")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help=f"seconds any single wait may take (default {DEFAULT_TIMEOUT:g})")
    p.add_argument("script", help="the training script (run once per trainer)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")


def run(args) -> int:
    configure("launcher")
    config = LaunchConfig(script=args.script, script_args=tuple(args.script_args), servers=args.servers,
                          trainers=args.trainers, mode=args.mode, dispatch=args.dispatch,
                          min_block_size=args.min_block_size, timeout=args.timeout,
                          secret=ClusterEnv.from_environ().secret)
    launcher = LocalLauncher(config).start()
    return launcher.wait()
