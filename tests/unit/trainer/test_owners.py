"""Issue 31, owners for state: the modules beside the Trainer get its TrainerProgress (or a public
method), never its private attributes; only ``paramshard.barrier()`` means "the most recently
built open Trainer of this process"."""
import pathlib
import re

import paramshard

SRC = pathlib.Path(paramshard.__file__).parent


def lines_matching(pattern: str, skip: set[str]) -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        name = str(path.relative_to(SRC))
        if name in skip:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(pattern, line):
                found.append(f"{name}:{n}: {line.strip()}")
    return found


def test_nothing_outside_the_trainer_reads_its_private_state():
    assert lines_matching(r"trainer\._[a-z]", {"trainer/trainer.py"}) == []


def test_only_paramshard_barrier_uses_the_process_s_newest_trainer():
    users = lines_matching(r"current_trainer", {"trainer/open_trainers.py"})
    assert [u.split(":")[0] for u in users] == ["__init__.py", "__init__.py"]
