"""`paramshard scale JOB --trainers N | --servers N | --add-host HOST | --remove-host HOST`: change a
running job's trainers (an elastic job, launched with --trainers MIN:MAX), its servers (launched with
--partitions P), or add a host to a running SSH job or take one off it, through the launcher's run
directory (launch/elastic/control_channel.py).

What the run directory already tells is answered at once, without asking the launcher: a job
that ended (control_channel.ended), and one that was not launched elastic in the way asked
(config.json's launch settings: ``min_trainers`` for --trainers, ``partitions`` for --servers).
"""
from __future__ import annotations

import json
from pathlib import Path

from paramshard.errors import ConfigError
from paramshard.launch.elastic.control_channel import ended, resolve_run_dir, send

HELP = ("change the trainers or servers of a running elastic job, or add a host to a running SSH job "
        "(new ranks then go there) or remove one")
EXAMPLE = ("paramshard scale runs/20261123-181500-job-ab12cd34ef56 --trainers 4",
           "paramshard scale job-ab12cd34ef56 --servers 3",
           "paramshard scale job-ab12cd34ef56 --add-host 10.0.0.7 --trainers 4",
           "paramshard scale job-ab12cd34ef56 --servers 4 --on 10.0.0.5",
           "paramshard scale job-ab12cd34ef56 --remove-host 10.0.0.7")


def add_arguments(p):
    p.add_argument("job", metavar="JOB", help="the job's run directory, or its job id (its newest run "
                                              "directory under ./runs)")
    p.add_argument("--trainers", type=int, metavar="N", help="run N trainers (within the MIN:MAX the job was "
                                                             "launched with); fewer: the highest leave at their "
                                                             "next step boundary")
    p.add_argument("--servers", type=int, metavar="N", help="run N servers (a job launched with --partitions P): "
                                                            "new ones take their share of the partitions; fewer: "
                                                            "servers a scale added give theirs back")
    p.add_argument("--add-host", metavar="HOST",
                   help="SSH jobs: make HOST ([user@]host[:port] [slots=N]) one of the job's hosts first: the "
                        "launcher probes it and copies the workspace if the job dispatches one; new trainers and "
                        "servers go to the least loaded host, so the next ones go there")
    p.add_argument("--remove-host", metavar="HOST",
                   help="SSH jobs: take HOST off the running job: its servers hand their partitions and dense "
                        "blocks to the others and exit, its trainers leave at their next step boundary (the job "
                        "runs that many fewer: --trainers N starts others), and no new rank goes there; refused "
                        "if it runs server 0 or trainer 0, or its trainers leaving would go below the minimum")
    p.add_argument("--on", metavar="HOST", help="with --servers, SSH jobs: start the new servers on HOST (one of the "
                                                "job's hosts, or the one --add-host adds) instead of the least "
                                                "loaded host")
    p.add_argument("--wait", type=float, default=30.0, metavar="S",
                   help="seconds to wait for each of the launcher's answers")


def launch_settings(run_dir) -> dict | None:
    """The job's launch settings from RUN_DIR/config.json; None before the launcher wrote it
    (the job is starting) or if it cannot be read: the launcher then answers for itself."""
    try:
        data = json.loads((Path(run_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    launch = data.get("launch") if isinstance(data, dict) else None
    return launch if isinstance(launch, dict) else None


def not_elastic(launch: dict | None, kind: str, value: int) -> str | None:
    """Why a job launched with ``launch`` cannot change its ``kind`` (trainers, servers), or None."""
    if launch is None:
        return None
    if kind == "trainers" and launch.get("min_trainers") is None:
        n = launch.get("trainers")
        return (f"--trainers {value}: this job is not elastic; launch it with --trainers MIN:MAX (e.g. --trainers "
                f"1:{max(value, n if isinstance(n, int) else 1)}) to change its trainers while it runs (it was "
                f"launched with --trainers {n})")
    if kind == "servers" and not launch.get("partitions"):
        return (f"--servers {value}: this job routes sparse ids by a fixed hash; launch it with --partitions P "
                f"(virtual partitions, a power of two, e.g. 1024) to add or remove servers while it runs")
    return None


def run(args) -> int:
    if args.remove_host:
        return remove_host(args)
    asked = [(kind, value) for kind, value in (("trainers", args.trainers), ("servers", args.servers))
             if value is not None]
    if len(asked) > 1 or not (asked or args.add_host):
        raise ConfigError("give one of --trainers N or --servers N, and/or --add-host HOST")
    if args.on and args.servers is None:
        raise ConfigError("--on HOST places new servers: give it with --servers N")
    run_dir = resolve_run_dir(args.job)
    over = ended(run_dir)
    if over:
        raise ConfigError(f"{over}: there is nothing to change; launch it again to train more "
                          f"(`paramshard report {run_dir}` tells what it did)")
    launch = launch_settings(run_dir)
    for kind, value in asked:
        why = not_elastic(launch, kind, value)
        if why:
            raise ConfigError(why)
    if args.add_host:         # first: the ranks asked for next may go there
        print(send(run_dir, "add_host", args.add_host, timeout=args.wait))
    for kind, value in asked:
        print(send(run_dir, kind, value, timeout=args.wait, host=args.on))
    return 0


def remove_host(args) -> int:
    """``--remove-host HOST``, alone: the launcher checks it whole (launch/elastic/host_removal.py) and answers
    what it moved and asked; replacements for the host's trainers are a later ``--trainers N`` (their
    slots are free once they left)."""
    others = [flag for flag, value in (("--trainers", args.trainers), ("--servers", args.servers),
                                       ("--add-host", args.add_host), ("--on", args.on)) if value is not None]
    if others:
        raise ConfigError(f"--remove-host {args.remove_host}: give it alone (not with {', '.join(others)}); once "
                          f"its trainers left, `scale --trainers N` starts others on the remaining hosts")
    run_dir = resolve_run_dir(args.job)
    over = ended(run_dir)
    if over:
        raise ConfigError(f"{over}: there is nothing to change (`paramshard report {run_dir}` tells what it did)")
    print(send(run_dir, "remove_host", args.remove_host, timeout=args.wait))
    return 0
