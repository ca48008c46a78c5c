"""`paramshard scale JOB --trainers N | --servers N | --add-host HOST`: change a running job's
trainers (an elastic job, launched with --trainers MIN:MAX), its servers (launched with
--partitions P), or add a host to a running SSH job, through the launcher's run directory
(launch/control_channel.py)."""
from __future__ import annotations

from ..errors import ConfigError
from ..launch.control_channel import resolve_run_dir, send

HELP = ("change the trainers or servers of a running elastic job, or add a host to a running SSH job "
        "(new ranks then go there)")
EXAMPLE = ("paramshard scale runs/20261123-181500-job-ab12cd34ef56 --trainers 4",
           "paramshard scale job-ab12cd34ef56 --servers 3",
           "paramshard scale job-ab12cd34ef56 --add-host 10.0.0.7 --trainers 4",
           "paramshard scale job-ab12cd34ef56 --servers 4 --on 10.0.0.5")


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
                   help="SSH jobs: not supported yet (refused with the reason): a host stays one of the job's "
                        "hosts until the job ends")
    p.add_argument("--on", metavar="HOST", help="with --servers, SSH jobs: start the new servers on HOST (one of the "
                                                "job's hosts, or the one --add-host adds) instead of the least "
                                                "loaded host")
    p.add_argument("--wait", type=float, default=30.0, metavar="S",
                   help="seconds to wait for each of the launcher's answers")


def run(args) -> int:
    if args.remove_host:
        # Not built yet: the host's servers would have to move their partitions away and stop, its
        # trainers leave, and the SSH placement drop it; refused before anything is sent.
        raise ConfigError(f"--remove-host {args.remove_host}: a host cannot leave a running job yet (its servers "
                          f"would have to hand their partitions over and stop, its trainers leave); scale its "
                          f"ranks down instead (--trainers N, --servers N: the highest ones go), the host stays")
    asked = [(kind, value) for kind, value in (("trainers", args.trainers), ("servers", args.servers))
             if value is not None]
    if len(asked) > 1 or not (asked or args.add_host):
        raise ConfigError("give one of --trainers N or --servers N, and/or --add-host HOST")
    if args.on and args.servers is None:
        raise ConfigError("--on HOST places new servers: give it with --servers N")
    run_dir = resolve_run_dir(args.job)
    if args.add_host:         # first: the ranks asked for next may go there
        print(send(run_dir, "add_host", args.add_host, timeout=args.wait))
    for kind, value in asked:
        print(send(run_dir, kind, value, timeout=args.wait, host=args.on))
    return 0
