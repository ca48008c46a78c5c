"""Split input files into per-trainer shards, and find a trainer's shard again.

``split_lines`` deals lines round-robin (line i of the inputs, counted across
all of them, goes to part i % N) so every part gets the same mix of the data
and the same number of lines give or take one. Parts are written as
``part-00000.tmp`` and renamed only when complete, so a crashed split never
leaves parts that look finished.
"""
from __future__ import annotations

import glob as globlib
import io
import os
import re
from dataclasses import dataclass
from pathlib import Path

from paramshard.errors import ConfigError
from paramshard.data.readers._reader import MAX_LINE_BYTES, as_paths, check_max_line_bytes, iter_lines, read_blocks

SPLIT_BY = ("lines", "files")
_PART_RE = re.compile(r"part-(\d+)")
_READ_HINT = 1 << 20  # bytes read per block


def part_name(index: int) -> str:
    return f"part-{index:05d}"


@dataclass(frozen=True)
class SplitReport:
    out_dir: Path
    parts: tuple[Path, ...]
    lines: tuple[int, ...]  # lines written to each part


def _existing_parts(out_dir: Path) -> list[Path]:
    return sorted(p for p in out_dir.iterdir() if _PART_RE.fullmatch(p.name))


def _part_number(part: Path) -> int:
    """N of a part-N file (one of _existing_parts)."""
    match = _PART_RE.fullmatch(part.name)
    assert match is not None, part
    return int(match.group(1))


def split_lines(inputs, num_shards: int, out_dir, by: str = "lines", force: bool = False,
                max_line_bytes: int = MAX_LINE_BYTES) -> SplitReport:
    """Write ``out_dir/part-00000 .. part-{N-1}`` from ``inputs`` (plain or .gz).

    by="lines": line i (across all inputs, in order) -> part i % N; a line longer
    than ``max_line_bytes`` raises DataFormatError, as the readers would.
    by="files": input file j -> part j % N, whole (needs at least N files).
    A last line without a newline gets one, so parts always hold whole lines.
    Existing part files in ``out_dir`` are an error unless ``force`` (then they
    are replaced), because stale parts from an earlier split with more shards
    would otherwise be read as data.
    """
    if num_shards < 1:
        raise ConfigError(f"--shards must be >= 1, got {num_shards}")
    if by not in SPLIT_BY:
        raise ConfigError(f"--by must be one of {', '.join(SPLIT_BY)}, got {by!r}")
    check_max_line_bytes(max_line_bytes)
    paths = as_paths(inputs)
    if by == "files" and len(paths) < num_shards:
        raise ConfigError(f"{len(paths)} input file(s) cannot fill {num_shards} shards by files; "
                          "use --by lines or fewer --shards")
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"--out {out_dir}: exists and is not a directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    old = _existing_parts(out_dir)
    if old and not force:
        raise ConfigError(f"{out_dir} already holds {len(old)} part file(s); "
                          "remove them or pass --force to replace them")

    final = [out_dir / part_name(k) for k in range(num_shards)]
    tmp = [p.with_name(p.name + ".tmp") for p in final]
    outs = [open(p, "wb") for p in tmp]
    try:
        if by == "lines":
            counts = _split_by_lines(paths, outs, max_line_bytes)
        else:
            counts = _split_by_files(paths, outs)
    except BaseException:
        for f, p in zip(outs, tmp):
            f.close()
            p.unlink(missing_ok=True)
        raise
    for f in outs:
        f.close()
    for p in old:
        p.unlink()
    for t, p in zip(tmp, final):
        os.replace(t, p)
    return SplitReport(out_dir, tuple(final), tuple(counts))


def _lines(path: Path, max_line_bytes: int):
    """Lists of whole lines, the last one newline-terminated even if the file's is not."""
    for _, block in iter_lines(path, _READ_HINT, max_line_bytes):
        yield io.BytesIO(block).readlines()  # splits at b"\n" only; bytes.splitlines() also at b"\r"


def _split_by_lines(paths, outs, max_line_bytes: int) -> list[int]:
    n = len(outs)
    counts = [0] * n
    seen = 0  # lines before the current block
    for path in paths:
        for lines in _lines(path, max_line_bytes):
            for k, out in enumerate(outs):
                mine = lines[(k - seen) % n::n]  # block-local indices i with (seen + i) % n == k
                out.writelines(mine)
                counts[k] += len(mine)
            seen += len(lines)
    return counts


def _split_by_files(paths, outs) -> list[int]:
    counts = [0] * len(outs)
    for j, path in enumerate(paths):
        k = j % len(outs)
        last = b"\n"
        for block in read_blocks(path, _READ_HINT):  # a byte copy: no line is ever held
            outs[k].write(block)
            counts[k] += block.count(b"\n")
            last = block[-1:]
        if last != b"\n":
            outs[k].write(b"\n")
            counts[k] += 1
    return counts


def shard_files(dir_or_glob, trainer_id: int, num_trainers: int) -> list[Path]:
    """The files trainer ``trainer_id`` of ``num_trainers`` reads: part k for
    every k with k % num_trainers == trainer_id.

    ``dir_or_glob`` is a directory written by ``split_lines`` (its part-NNNNN
    files must be complete: part-00000 .. part-{n-1}) or a glob pattern, whose
    matches are taken in sorted order.
    """
    if num_trainers < 1 or not 0 <= trainer_id < num_trainers:
        raise ConfigError(f"trainer {trainer_id} of {num_trainers}: not a valid trainer index")
    where = Path(dir_or_glob)
    if where.is_dir():
        parts = _existing_parts(where)
        numbers = [_part_number(p) for p in parts]
        missing = sorted(set(range(len(parts))) - set(numbers))
        if missing:
            raise ConfigError(f"{where}: {part_name(missing[0])} is missing (found {len(parts)} "
                              "parts); the split was incomplete or mixed, run split-data again")
        parts.sort(key=_part_number)
    else:
        parts = sorted(Path(p) for p in globlib.glob(str(dir_or_glob)) if Path(p).is_file())
    if not parts:
        raise ConfigError(f"no data files in {dir_or_glob} (a directory of part-NNNNN files or a "
                          "glob); make them with `paramshard split-data INPUT --shards N --out DIR`")
    if len(parts) < num_trainers:
        raise ConfigError(f"{dir_or_glob} has {len(parts)} part(s) for {num_trainers} trainers, so "
                          f"some trainers would get no data; split again with --shards {num_trainers} "
                          "(or a multiple of it)")
    return parts[trainer_id::num_trainers]
