"""The settings table (src/paramshard/settings/): everything generated from it stays in step."""
from __future__ import annotations

import re
from pathlib import Path

from paramshard.settings import table
from paramshard.settings.docs import environment_markdown

ROOT = Path(__file__).parents[3]
SRC = ROOT / "src" / "paramshard"


def test_docs_environment_md_is_the_generated_one():
    text = (ROOT / "docs" / "environment.md").read_text()
    assert text == environment_markdown(), \
        "docs/environment.md is stale: paramshard env --markdown > docs/environment.md"


def _declared() -> set[str]:
    return {name for s in table.SETTINGS for name, _, _ in s.rows()}


def test_every_paramshard_variable_in_the_code_is_declared():
    named = {m for path in SRC.rglob("*.py") for m in re.findall(r"\bPARAMSHARD_[A-Z0-9_]*[A-Z0-9]",
                                                                 path.read_text())}
    assert named - _declared() == set(), "declare them in src/paramshard/settings/"


def test_no_setting_is_read_outside_the_table():
    # environ.get("NAME") / environ["NAME"] with a literal name: a setting read behind the table's back.
    read = re.compile(r"environ(?:\.get\(|\[)\s*[\"'](PARAMSHARD_\w+|GLOO_\w+|GLIBC_\w+|OMP_\w+|MKL_\w+)")
    found = [(str(p.relative_to(SRC)), m) for p in SRC.rglob("*.py") if "settings" not in p.parts
             for m in read.findall(p.read_text())]
    # cli/jobs/run.py re-executes itself under GLIBC_TUNABLES (the launch helper's region, left as it is).
    assert [f for f in found if f[0] != "cli/jobs/run.py"] == []
