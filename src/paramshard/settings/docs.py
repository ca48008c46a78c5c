"""docs/environment.md, generated from the table (`paramshard env --markdown` prints it;
tests/unit/settings/test_settings.py fails when the file is out of date)."""
from __future__ import annotations

from paramshard.settings import table
from paramshard.settings.engines import ENGINE_VARIABLES

TITLE = "# The environment contract"
INTRO = """\
Generated from `src/paramshard/settings/` by `paramshard env --markdown > docs/environment.md`;
do not edit by hand.

Every process reads these variables once, at start, into a frozen `ClusterEnv`
(`paramshard env --show` prints this process's reading). `paramshard launch` writes them for
every rank; SSH, OpenMPI, Slurm, torchrun or Kubernetes set the same variables, so one script
runs under any engine. A flag named in the third column sets the variable for the job."""


def variables_markdown() -> str:
    rows = ["| variable | meaning | flags | also read (PaddlePaddle) |", "|---|---|---|---|"]
    for setting in table.SETTINGS:
        for name, meaning, flags in setting.rows():
            also = ", ".join(setting.fallbacks) if name == setting.env else ""
            rows.append(f"| `{name}` | {meaning} | {flags or '-'} | {also or '-'} |")
    return "\n".join(rows)


def engine_variables_markdown() -> str:
    rows = ["| engine | variable | what `paramshard run` takes from it |", "|---|---|---|"]
    for engine, name, use in ENGINE_VARIABLES:
        shown = name if name.startswith("(") else ", ".join(f"`{n.strip()}`" for n in name.split(","))
        rows.append(f"| {engine} | {shown} | {use} |")
    return "\n".join(rows)


def environment_markdown() -> str:
    return "\n".join([TITLE, "", INTRO, "", variables_markdown(), "", "## Read from each engine by `paramshard run`",
                      "", engine_variables_markdown(), ""])
