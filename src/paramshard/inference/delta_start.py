"""What a delta directory's followers need besides the servers' files, written by the chief
trainer once its Trainer started (a trainer listener, paramshard/events.py):

- ``DELTA_DIR/model.pt``: the model file as ``snapshot_model`` writes it (the spec and table
  settings a serving replica builds the model from, and the values at the start);
- ``DELTA_DIR/blocks.json``: ``{"block name": [parameter name, offset, elements]}`` from the
  trainer's ShardPlan, how a dense block of a delta lands in its parameter (flattened).

Both are replaced atomically (a follower never reads half a file); a chief restarted (a rollback,
a resume) writes them again.
"""
from __future__ import annotations

import json
from pathlib import Path

from paramshard.export import replaced_into_place
from paramshard.inference.serving import snapshot_model
from paramshard.online.delta_log import DeltaLog


def block_layout(plan) -> dict[str, list]:
    """blocks.json's content: block name -> [parameter, offset into it (elements), elements]."""
    return {b.name: [b.param, int(b.offset), int(b.size)] for b in (plan.blocks if plan is not None else ())}


def write_start_files(trainer, root) -> None:
    log = DeltaLog(root)
    log.root.mkdir(parents=True, exist_ok=True)
    snapshot_model(trainer, log.root / "model.pt")
    target = log.root / "blocks.json"
    with replaced_into_place(target) as tmp:
        Path(tmp).write_text(json.dumps(block_layout(trainer.plan), indent=1, sort_keys=True))


class DeltaStart:
    """The chief's trainer listener: the files once the Trainer started, nothing per step."""

    def __init__(self, root):
        self.root = root

    def started(self, trainer) -> None:
        write_start_files(trainer, self.root)

    def after_step(self, step, loss, pipeline, staleness) -> None:
        pass

    def log(self, **values) -> None:
        pass

    def close(self) -> None:
        pass
