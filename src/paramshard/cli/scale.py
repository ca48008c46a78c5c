"""`paramshard scale JOB --trainers N`: change a running elastic job's trainers (or, once
live re-sharding lands, its servers), through the launcher's run directory
(launch/control_channel.py)."""
from __future__ import annotations

from ..errors import ConfigError
from ..launch.control_channel import resolve_run_dir, send

HELP = "change the trainers of a running elastic job (launched with --trainers MIN:MAX)"
EXAMPLE = ("paramshard scale runs/20261123-181500-job-ab12cd34ef56 --trainers 4",
           "paramshard scale job-ab12cd34ef56 --trainers 2")


def add_arguments(p):
    p.add_argument("job", metavar="JOB", help="the job's run directory, or its job id (its newest run "
                                              "directory under ./runs)")
    p.add_argument("--trainers", type=int, metavar="N", help="run N trainers (within the MIN:MAX the job was "
                                                             "launched with); fewer: the highest leave at their "
                                                             "next step boundary")
    p.add_argument("--servers", type=int, metavar="N", help="run N servers (not available yet)")
    p.add_argument("--wait", type=float, default=30.0, metavar="S",
                   help="seconds to wait for the launcher's answer")


def run(args) -> int:
    asked = [(kind, value) for kind, value in (("trainers", args.trainers), ("servers", args.servers))
             if value is not None]
    if len(asked) != 1:
        raise ConfigError("give one of --trainers N or --servers N")
    kind, value = asked[0]
    print(send(resolve_run_dir(args.job), kind, value, timeout=args.wait))
    return 0
