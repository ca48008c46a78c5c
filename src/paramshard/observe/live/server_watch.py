"""What observe/ adds around a server process (events.ServerListener): its /metrics
endpoint (PARAMSHARD_METRICS_PORT), its own records under ``paramshard run
--run-dir``, and under ``paramshard launch`` its last counters on stdout.

Registered from the top (paramshard/__init__.py), so ``runtime.serve`` never imports observe/.
"""
from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING

from paramshard.messages.server_stats import ServerStats
from paramshard.observe.live.monitor import server_record
from paramshard.observe.live.prometheus import server_metrics
from paramshard.observe.run_records.rank_records import ServerRecorder, run_dir_of, write_rank
from paramshard.observe.run_records.records import MARK


class ServerWatch:
    def __init__(self, env, server):
        self.env, self.server = env, server
        self.metrics = server_metrics(env, server)     # None unless PARAMSHARD_METRICS_PORT is set
        self.recorder = None
        try:
            run_dir = run_dir_of(env)                  # `paramshard run --run-dir`: this rank writes its own records
            if run_dir is not None:
                write_rank(run_dir, env.rank_name, env)
                self.recorder = ServerRecorder(run_dir, server)
        except BaseException:
            self.close(None)
            raise

    def close(self, exit_code: int | None) -> None:
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        if exit_code is None:
            return
        if self.recorder is not None:
            self.recorder.close(exit_code)
            self.recorder = None
        if self.env.records == "stdout":
            print_final_record(self.server)


def print_final_record(server) -> None:
    """Under `paramshard launch`: this server's last counters, for the run directory (the
    launcher asks every few seconds, but a job may end between two asks)."""
    stats = ServerStats.from_wire(server.snapshot_stats())
    record = dict(server_record(stats, None, time.time(), None), final=True)
    sys.stdout.write(MARK + json.dumps(record, separators=(",", ":"), default=float) + "\n")
    sys.stdout.flush()


if TYPE_CHECKING:   # `make typecheck` checks the contract: ServerListener (events.py)
    from paramshard.events import ServerListener
    _server_listener: type[ServerListener] = ServerWatch
