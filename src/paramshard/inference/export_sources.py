"""What `paramshard export SOURCE` reads: a run directory, a checkpoint directory or one
step directory, found as the checkpoint to export.

A run directory (`paramshard launch`, `paramshard run --run-dir`) records the job's
checkpoint directory: config.json's launch settings (``checkpoint_dir``, made
absolute by `paramshard launch`) or a rank's environment
(the checkpoint_dir setting's variable, in config.json's ranks or ranks/*.json).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from paramshard.checkpoint.format import LATEST, MANIFEST, Checkpoint, CheckpointError, checkpoints
from paramshard.errors import ConfigError
from paramshard.settings.table import by_field

CHECKPOINT_VARIABLE = by_field("checkpoint_dir").env      # the rank's variable for --checkpoint-dir
EXPECTED = ("a run directory (of `paramshard launch` or `paramshard run --run-dir`), a checkpoint directory "
            "(--checkpoint-dir) or one step-NNNNNNNN directory in it")
MAX_CONFIG_BYTES = 64 << 20      # config.json holds every rank's environment: far below this


def is_checkpoint_dir(path: Path) -> bool:
    return (path / MANIFEST).is_file() or (path / LATEST).exists() or bool(checkpoints(path))


def is_run_dir(path: Path) -> bool:
    return (path / "config.json").is_file() or (path / "ranks").is_dir()


def find_checkpoint(source) -> Checkpoint:
    """The checkpoint ``source`` names (a run directory: its job's latest checkpoint)."""
    path = Path(source)
    if not path.is_dir():
        raise ConfigError(f"{source}: {'not a directory' if path.exists() else 'no such directory'}; "
                          f"expected {EXPECTED}")
    if is_checkpoint_dir(path):
        return Checkpoint(path)
    if not is_run_dir(path):
        raise ConfigError(f"{source} is none of {EXPECTED}: it has no {MANIFEST}, {LATEST} or step-* directory, "
                          f"and no config.json or ranks/")
    recorded = recorded_checkpoint_dir(path)
    if recorded is None:
        raise ConfigError(f"run directory {source}: the job recorded no checkpoint directory (it ran without "
                          f"--checkpoint-dir): there is nothing to export; pass a checkpoint directory instead")
    try:
        return Checkpoint(recorded)
    except CheckpointError as exc:
        raise ConfigError(f"run directory {source}: its job's checkpoint directory {recorded}: {exc}") from None


def recorded_checkpoint_dir(run_dir: Path) -> str | None:
    """The checkpoint directory the run directory's job was given, or None."""
    config = _json(run_dir / "config.json")
    launch = config.get("launch")
    if isinstance(launch, dict) and isinstance(launch.get("checkpoint_dir"), str) and launch["checkpoint_dir"]:
        return launch["checkpoint_dir"]
    ranks = config.get("ranks")
    ranks = ranks if isinstance(ranks, dict) else {}
    contracts = list(ranks.values())
    contracts += [_json(p) for p in sorted((run_dir / "ranks").glob("*.json"))] if (run_dir / "ranks").is_dir() else []
    for contract in contracts:
        environ = contract.get("environ") if isinstance(contract, dict) else None
        value = environ.get(CHECKPOINT_VARIABLE) if isinstance(environ, dict) else None
        if isinstance(value, str) and value:
            return value
    return None


def _json(path: Path) -> dict:
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: {path.stat().st_size} bytes, not a run directory's record")
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: unreadable ({exc}); is it a run directory?") from None
    return data if isinstance(data, dict) else {}


def checkpoint_table(ckpt: Checkpoint, name: str) -> tuple[np.ndarray, np.ndarray, dict]:
    """Table ``name`` of the checkpoint as `paramshard export --table` writes it from live
    servers: ids (uint64, sorted), values float32 [rows, dim], and its settings."""
    entries = {t["name"]: t for t in ckpt.manifest["sparse"]}
    entry = entries.get(name)
    if entry is None:
        raise ConfigError(f"{ckpt.path} has no sparse table {name!r}; its tables: {sorted(entries) or 'none'}")
    ids = ckpt.array(entry["files"]["ids"]).astype(np.uint64, copy=False)
    values = ckpt.array(entry["files"]["values"]).astype(np.float32, copy=False)
    order = np.argsort(ids, kind="stable")
    meta = {"name": name, "dim": entry["dim"], "seed": entry["seed"], "init_scale": entry["init_scale"],
            "optimizer": entry["optimizer"]}
    return ids[order], values[order], meta
