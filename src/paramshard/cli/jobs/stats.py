"""`paramshard stats`: a live table of a running job's servers: every one it has now, those a
`paramshard scale --servers` added included (the routing server 0 holds names them:
observe/live/server_list.py), those a scale removed shown so."""
from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

from paramshard.client import control
from paramshard.env import ClusterEnv
from paramshard.errors import ConfigError, ParamshardError
from paramshard.observe.live.monitor import server_record
from paramshard.observe.live.progress import server_line
from paramshard.observe.run_records.run_dir import read_secret
from paramshard.observe.live.server_list import JobServers
from paramshard.observe.live.terminal import is_live_terminal
from paramshard.mode import Mode

HELP = "a live table of a running job's servers (from its run directory or their addresses)"
EXAMPLE = ("paramshard stats runs/20261123-181500-job-ab12cd34ef56",
           "paramshard stats --servers 127.0.0.1:6000,127.0.0.1:6001 --once")


def add_arguments(p):
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="a run directory of `paramshard launch`")
    p.add_argument("--servers", metavar="ADDRS", help="server addresses host:port,... instead of a run directory")
    p.add_argument("--every", type=float, default=2.0, metavar="S", help="seconds between refreshes")
    p.add_argument("--once", action="store_true", help="print one table and exit")
    p.add_argument("--json", action="store_true", help="print each server's raw counters as JSON (implies --once)")


def _target(args) -> ClusterEnv:
    """The servers to ask, with the job's security: the secret `paramshard launch` made for
    the job (RUN_DIR/secret, this user's only), else this shell's PARAMSHARD_SECRET (a
    secret the user gave is never written anywhere)."""
    outer = ClusterEnv.from_environ()
    if args.servers:
        servers = tuple(a.strip() for a in args.servers.split(",") if a.strip())
        return ClusterEnv(role=None, servers=servers, secret=outer.secret, keys_dir=outer.keys_dir,
                          job_id=outer.job_id, timeout=outer.timeout)
    if not args.run_dir:
        raise ConfigError("give a run directory (RUN_DIR) or --servers host:port,...")
    config = Path(args.run_dir) / "config.json"
    if not config.is_file():
        raise ConfigError(f"{args.run_dir}: no config.json; is it a run directory of `paramshard launch`?")
    data = json.loads(config.read_text())
    ranks = data.get("ranks", {})
    servers = ranks.get("server 0", {}).get("environ", {}).get("PARAMSHARD_SERVERS", "")
    if not servers and not Mode.parse(data.get("launch", {}).get("mode") or "sync").has_servers:
        raise ConfigError(f"{args.run_dir}: a collective-mode job has no servers to ask; its trainers' progress "
                          f"is in metrics.jsonl (`paramshard report {args.run_dir}` draws it)")
    if not servers:
        raise ConfigError(f"{config}: no server addresses in it")
    try:
        secret = read_secret(args.run_dir)
    except OSError as exc:
        raise ConfigError(f"{args.run_dir}: cannot read the job's secret ({exc.strerror}): only the user who "
                          f"launched the job can ask its servers") from None
    launch = data.get("launch", {})
    if secret is None and launch.get("secret") and not outer.secret:
        raise ConfigError(f"{args.run_dir}: the job runs with the PARAMSHARD_SECRET it was launched with: set the "
                          f"same PARAMSHARD_SECRET in this shell")
    keys_dir = None if secret else outer.keys_dir
    return ClusterEnv(role=None, servers=tuple(servers.split(",")), secret=secret or outer.secret,
                      keys_dir=keys_dir, job_id=data.get("job_id"), timeout=outer.timeout)


def _table(servers: JobServers, before: dict) -> tuple[list[str], list[dict]]:
    servers.refresh(timeout=5.0)
    lines, raw = [], []
    now = time.time()
    records = {}
    for s in servers.live():
        links, index = servers.link(s)
        try:
            stats = control.read_stats(links, index, timeout=5.0)
        except ParamshardError as exc:
            lines.append(f"server {s}: no answer ({exc})")
            continue
        raw.append(stats.to_wire())
        old, then = before.get(s, (None, None))
        records[s] = server_record(stats, old, now, then)
        before[s] = (stats, now)
    lines += [f"server {s}: removed by a scale (it exits once no trainer routes to it)" for s in sorted(servers.removed)]
    total = sum(r.get("elements", 0) for r in records.values())
    return [server_line(s, r, total) for s, r in sorted(records.items())] + lines, raw


def run(args) -> int:
    env = _target(args)
    with control.connect(env, who="paramshard stats", timeout=10.0) as links:
        servers = JobServers(links, lambda address: control.connect(
            dataclasses.replace(env, servers=(address,)), who="paramshard stats", timeout=10.0))
        try:
            return _show(args, servers)
        finally:
            servers.close()


def _show(args, servers: JobServers) -> int:
    before: dict = {}
    if args.json:
        _, raw = _table(servers, before)
        print(json.dumps(raw, indent=1))
        return 0
    if args.once:
        print("\n".join(_table(servers, before)[0]))
        return 0
    if not is_live_terminal(sys.stdout):
        # A file, a pipe, a rank's forwarded output: a plain table every few seconds rather
        # than a screen redrawn in place (escape codes a file would keep).
        try:
            while True:
                print("\n".join(_table(servers, before)[0]) + "\n", flush=True)
                time.sleep(args.every)
        except KeyboardInterrupt:
            return 0
    from rich.live import Live
    from rich.text import Text
    with Live(refresh_per_second=1) as live:
        try:
            while True:
                live.update(Text("\n".join(_table(servers, before)[0])))
                time.sleep(args.every)
        except KeyboardInterrupt:
            return 0
