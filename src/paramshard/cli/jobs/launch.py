from __future__ import annotations

import argparse
import os
import re
import sys

from paramshard.checkpoint.format import Checkpoint
from paramshard.env import ClusterEnv
from paramshard.launch.engines.hosts import parse_hosts
from paramshard.launch.api import LaunchConfig
from paramshard.launch.engines.local import LocalPlacement
from paramshard.launch.engines.placement import Placement
from paramshard.launch.engines.ssh import SshHosts, SshOptions
from paramshard.launch.supervision.build import build_launcher
from paramshard.launch.supervision.listeners import JobListeners
from paramshard.launch.supervision.restart_policy import RestartPolicy
from paramshard.launch.supervision.supervisor import Supervisor
from paramshard.launch.rank import app_check, target
from paramshard.errors import ConfigError
from paramshard.log import configure, get_logger
from paramshard.mode import Mode
from paramshard.observe.live.job_watch import JobWatch
from paramshard.observe.run_records.records import default_run_dir
from paramshard.settings.argtypes import flag_error
from paramshard.settings.contract import WATCH
from paramshard.settings.flags import add_flags, launch_fields
from paramshard.settings.process_variables import FORK

log = get_logger("launch")

HELP = "run a training script (or -m MODULE) as a cluster: on this machine, or over SSH on --hosts"

EPILOG = """\
examples:
  paramshard launch --servers 2 --trainers 4 --mode async train.py --epochs 3
      2 parameter servers and 4 trainers on this machine; --epochs 3 goes to train.py
  paramshard launch --servers 2 --trainers 4 -m mypkg.train --epochs 3
      the same with `python -m mypkg.train --epochs 3` as each trainer
  paramshard launch --servers 0 --trainers 4 --mode collective train.py
      no servers: dense gradients averaged by allreduce (DDP over gloo); --mode hybrid keeps
      the SparseEmbedding tables on servers (README "Choosing a mode")
  paramshard launch --hosts 10.0.0.1,10.0.0.2 --dispatch-package . --servers 2 --trainers 4 train.py
      copy this directory to two machines and run the job there over SSH (README "Many machines")

threads: every process gets OMP_NUM_THREADS and MKL_NUM_THREADS = the CPUs of its host / the job's
processes on that host (at least 1), so they do not fight over the cores; an OMP_NUM_THREADS set
here is passed on instead.
"""

# "10.0.0.1:6174,10.0.0.2:6174", "[::1]:6174", "node1:6174": what a PaddlePaddle user passes to --servers.
_HOST_PORT = re.compile(r"^(\[[^\]]+\]|[^\s,:\[\]]+):\d+$")


def _server_count(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        pass
    items = [item.strip() for item in text.split(",") if item.strip()]
    if items and all(_HOST_PORT.match(item) for item in items):
        hosts = ",".join(item.rsplit(":", 1)[0] for item in items)
        raise flag_error(f"--servers takes a number of servers; to run on several machines use "
                          f"--hosts {hosts} (see README \"Many machines\")")
    raise flag_error(f"--servers {text}: not a number; --servers takes a number of servers")


def preprocess(argv: list[str]) -> list[str]:
    """`--resume SCRIPT ...` means the latest checkpoint, not a checkpoint named SCRIPT:
    argparse would take the script as --resume's value. A checkpoint is a directory.
    `-mMODULE` and `--module=MODULE` become `-m MODULE` (see launch/rank/target.py)."""
    argv = list(argv)
    for i, token in enumerate(argv[:-1]):
        if token == "--resume" and os.path.isfile(argv[i + 1]):
            argv[i] = "--resume="
            break
    return target.split_attached_module(argv, add_arguments)


def add_arguments(p: argparse.ArgumentParser) -> None:
    # A formatter class (the checker knows it only as a callable making a formatter).
    if not (isinstance(p.formatter_class, type)
            and issubclass(p.formatter_class, argparse.RawDescriptionHelpFormatter)):
        p.formatter_class = argparse.RawDescriptionHelpFormatter    # keeps the epilog's line breaks
    p.epilog = EPILOG
    p.add_argument("--servers", type=_server_count, default=None,
                   help="number of parameter servers (default 1; 0 with --mode collective)")
    # Every flag that sets a job's setting comes from the table (settings/contract.py), groups too.
    groups = add_flags(p, "launch")
    watch = groups.get(WATCH) or p.add_argument_group(WATCH)
    watch.add_argument("--run-dir", metavar="DIR",
                       help="where this run's logs, configuration, plan, metrics.jsonl and summary.json go "
                            "(default runs/YYYYmmdd-HHMMSS-JOBID)")
    watch.add_argument("--report", action="store_true",
                       help="at the end, write the run directory's plots and index.html (paramshard report)")
    ssh = p.add_argument_group("many machines (over SSH)")
    ssh.add_argument("--hosts", metavar="HOSTS",
                     help="comma list or file of '[user@]host[:port] [slots=N]': run the ranks there over ssh; "
                          "each host name or address must be reachable from every other host")
    ssh.add_argument("--server-hosts", metavar="HOSTS", help="put the servers on these hosts only")
    ssh.add_argument("--trainer-hosts", metavar="HOSTS", help="put the trainers on these hosts only")
    ssh.add_argument("--ssh-config", metavar="FILE", help="ssh client config, passed as ssh -F FILE")
    ssh.add_argument("--remote-python", metavar="PATH", default=sys.executable,
                     help="Python interpreter on the hosts, an absolute path (default: this one's path)")
    ssh.add_argument("--dispatch-package", metavar="DIR",
                     help="copy DIR to every host first (rsync, incremental) and run there; "
                          "the script must be inside DIR (a -m module: importable from DIR or installed)")
    ssh.add_argument("--workspace", metavar="DIR",
                     help="directory on the hosts to run in (default with --dispatch-package: "
                          "~/.paramshard/JOB_ID; alone: already deployed there)")
    target.add_module_argument(p)
    target.no_abbreviations(p)
    p.add_argument("script", nargs="?", help="the training script (run once per trainer), unless -m MODULE")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")


def _fork(args) -> bool:
    """--fork, or PARAMSHARD_FORK=1 (the test suite's switch): ranks forked (launch/engines/fork_server.py).
    Only the local engine forks: refused with --hosts, where the variable is only ignored."""
    if args.hosts:
        if args.fork:
            raise ConfigError("--fork forks ranks on this machine; with --hosts they start over ssh on other "
                              "hosts: drop --fork")
        if FORK.read(os.environ):
            log.warning("PARAMSHARD_FORK=1: this job runs over SSH (--hosts), where ranks are not forked; ignored")
        return False
    return bool(args.fork or FORK.read(os.environ))


def _placement(args, config_fields: dict) -> Placement:
    """Where a run's ranks go, for its LaunchConfig (checked whole: hosts, package, script)."""
    ssh_flags = [f for f in ("server_hosts", "trainer_hosts", "ssh_config", "dispatch_package", "workspace")
                 if getattr(args, f)]
    if not args.hosts:
        if ssh_flags:
            raise ConfigError(f"--{ssh_flags[0].replace('_', '-')} needs --hosts")
        return LocalPlacement(LaunchConfig(**config_fields, fork=_fork(args)))
    _fork(args)
    options = SshOptions(ssh_config=args.ssh_config, remote_python=args.remote_python,
                         workspace=args.workspace, dispatch_package=args.dispatch_package)
    # Without a package to copy, the script lives on the hosts (shared file system or deployed).
    config = LaunchConfig(**config_fields, check_script=bool(args.dispatch_package))
    return SshHosts(config, parse_hosts(args.hosts), options,
                    parse_hosts(args.server_hosts) if args.server_hosts else None,
                    parse_hosts(args.trainer_hosts) if args.trainer_hosts else None)


def _checkpoint_fields(args) -> dict:
    """Checkpoint flags as LaunchConfig fields, paths absolute (ranks run elsewhere); a
    checkpoint to resume from must be readable now, not in every trainer later."""
    if args.checkpoint_every and not args.checkpoint_dir:
        raise ConfigError("--checkpoint-every needs --checkpoint-dir")
    if args.max_restarts < 0:
        raise ConfigError(f"--max-restarts {args.max_restarts}: must be >= 0")
    if args.recovery == "bounded-loss" and not args.max_restarts:
        raise ConfigError("--recovery bounded-loss restores a server the launcher restarts in place: give "
                          "--max-restarts N (how many times it may)")
    elastic = isinstance(args.trainers, tuple) or args.min_trainers is not None
    if args.max_restarts and not args.checkpoint_dir and not elastic and args.recovery != "bounded-loss":
        raise ConfigError("--max-restarts needs --checkpoint-dir (a restart resumes from the latest checkpoint; "
                          "only an elastic job, --trainers MIN:MAX, replaces dead trainers without one, and "
                          "--recovery bounded-loss restores servers from the launcher's copy)")
    fields = {"checkpoint_keep": args.keep}
    if args.checkpoint_dir:
        fields.update(checkpoint_dir=os.path.abspath(args.checkpoint_dir), checkpoint_every=args.checkpoint_every or 0)
    if args.resume is not None:
        source = args.resume or args.checkpoint_dir
        if not source:
            raise ConfigError("--resume without a directory resumes from --checkpoint-dir's latest: give one of them")
        fields["resume"] = str(Checkpoint(source).path.resolve())
    return fields


def _split_trainer_range(fields: dict) -> None:
    """--trainers MIN:MAX: MAX trainer slots, elastic down to MIN (launch/elastic/elastic_trainers.py)."""
    if isinstance(fields.get("trainers"), tuple):
        low, high = fields["trainers"]
        if fields.get("min_trainers") not in (None, low):
            raise ConfigError(f"--trainers {low}:{high} and --min-trainers {fields['min_trainers']}: give the "
                              f"minimum once")
        fields.update(trainers=high, min_trainers=low)


def run(args) -> int:
    configure("launcher")
    outer = ClusterEnv.from_environ()   # security and limits the user set are passed on
    script, module, script_args = target.from_args(args.script, args.module, args.script_args)
    servers = args.servers if args.servers is not None else (1 if Mode.parse(args.mode).has_servers else 0)
    # The flags' settings, and the ones the launcher's own environment passes on (security, limits).
    fields = dict(launch_fields(args, "launch", outer), script=script, module=module, script_args=script_args,
                  servers=servers, **_checkpoint_fields(args), records="stdout")
    _split_trainer_range(fields)
    if fields.get("delta_dir"):     # absolute, as the checkpoints': ranks and `paramshard report` read it elsewhere
        fields["delta_dir"] = os.path.abspath(fields["delta_dir"])
    if args.max_staleness is not None and args.max_staleness < 0:
        raise ConfigError(f"--max-staleness {args.max_staleness}: must be >= 0 steps")
    # Checked whole before the run directory is made: a refused job leaves none.
    placement = _placement(args, dict(fields, max_restarts=args.max_restarts))
    config = placement.config
    # The program's own check of its arguments (launch/rank/app_check.py), before any process
    # or the run directory: a bad flag is refused once, in a second. Over SSH the files it names
    # are on the hosts: only the arguments are checked.
    app_check.check_arguments(script, module, script_args, files=not args.hosts,
                              search=os.path.abspath(args.dispatch_package) if args.dispatch_package else None)
    fields.setdefault("job_id", config.job_id)      # restarts: one job, one run directory
    fields["secret"] = config.secret                # and one secret (made by LaunchConfig if none was given)
    watch = JobWatch(args.run_dir or default_run_dir(config.job_id), config.job_id, report=args.report)
    if config.secret and not outer.secret:
        watch.run.write_secret(config.secret)       # for `paramshard stats RUN_DIR` (mode 0600)
        log.info("connections are encrypted (CurveZMQ) with a secret made for this job, kept in %s/secret for "
                 "`paramshard stats`; --insecure for plain TCP", watch.run.path)
    elif config.insecure:
        log.warning("--insecure: connections are plain TCP; any process that reaches the servers' ports can read "
                    "and change the model")

    policy = RestartPolicy(args.max_restarts)       # the job's one budget: every run spends from it
    # The run directory's watch hears each run's restarts, membership changes and events.
    listeners = JobListeners(**watch.listeners())

    def relaunch(restarts_left: int, resume: str):
        # The next run of the same job: one job id, one run directory, one secret, one budget.
        fields["resume"] = resume
        again = _placement(args, dict(fields, max_restarts=restarts_left))
        return build_launcher(again.config, again, policy=policy, listeners=listeners, **watch.launcher_options())

    first = build_launcher(config, placement, policy=policy, listeners=listeners, **watch.launcher_options())
    supervisor = Supervisor(first, relaunch, policy, fields.get("checkpoint_dir"), watch)
    try:
        return supervisor.run()
    finally:
        watch.finished(supervisor.code, supervisor.launcher)
