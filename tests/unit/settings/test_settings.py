"""The settings table (src/paramshard/settings/): everything generated from it stays in step."""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap
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
    # cli/run.py re-executes itself under GLIBC_TUNABLES (the launch helper's region, left as it is).
    assert [f for f in found if f[0] != "cli/run.py"] == []


# A new setting, declared in one place (here, as a test), flows everywhere without other edits.
NEW_SETTING = textwrap.dedent('''
    import argparse, importlib
    from paramshard.settings import JOB, K8S, LAUNCH, Setting, flag, table
    knob = Setting("PARAMSHARD_TEST_KNOB", "a knob for the test", "test_knob", 5, "int", int,
                   scopes=frozenset({JOB, LAUNCH, K8S}),
                   flags=(flag("launch", "--test-knob", "the knob", type=int),
                          flag("run", "--test-knob", "the knob", type=int),
                          flag("k8s", "--test-knob", "the knob", type=int)))
    table.SETTINGS += (knob,)
    import paramshard.env, paramshard.launch.api, paramshard.launch.engines.k8s
    import paramshard.cli.launch, paramshard.cli.run, paramshard.cli.k8s
    for module in (paramshard.env, paramshard.launch.api, paramshard.launch.engines.k8s):
        importlib.reload(module)
    from paramshard.env import ClusterEnv
    from paramshard.launch.api import JobSpec, LaunchConfig
    from paramshard.launch.engines.k8s import K8sJobSpec, render_manifests
    from paramshard.settings.docs import variables_markdown
    from paramshard.settings.flags import contract_changes, launch_fields, spec_fields

    # environment contract: read, default, written
    env = ClusterEnv.from_environ({"PARAMSHARD_TEST_KNOB": "7"})
    assert env.test_knob == 7 and env.to_environ()["PARAMSHARD_TEST_KNOB"] == "7"
    assert ClusterEnv(role=None).test_knob == 5
    assert "PARAMSHARD_TEST_KNOB" not in ClusterEnv(role=None).to_environ()
    # the launcher: a LaunchConfig field, copied into every rank's contract and environment
    config = LaunchConfig(module="m", test_knob=9)
    assert config.base_env(["h:1"]).test_knob == 9
    spec = JobSpec.build(config, ["127.0.0.1:1"], "python")
    assert all(r.environ()["PARAMSHARD_TEST_KNOB"] == "9" for r in spec.servers + spec.trainers)
    # the commands' flags
    def parse(module, argv):
        p = argparse.ArgumentParser()
        module.add_arguments(p)
        return p.parse_args(argv)
    args = parse(paramshard.cli.launch, ["--test-knob", "11", "-m", "m"])
    outer = ClusterEnv.from_environ({})
    assert launch_fields(args, "launch", outer)["test_knob"] == 11
    args = parse(paramshard.cli.run, ["--servers", "1", "--test-knob", "12", "-m", "m"])
    assert contract_changes(args, "run")["test_knob"] == 12
    args = parse(paramshard.cli.k8s, ["--trainers", "1", "--image", "i", "--test-knob", "13", "-m", "m"])
    k8s = K8sJobSpec(**spec_fields(args), script=None, module="m", image="i", servers=1, secret="s")
    pods = [d["spec"]["template"]["spec"]["containers"][0]["env"] for d in render_manifests(k8s)
            if d["kind"] in ("StatefulSet", "Job")]
    assert all({"name": "PARAMSHARD_TEST_KNOB", "value": "13"} in env for env in pods), pods
    # the docs
    assert "| `PARAMSHARD_TEST_KNOB` | a knob for the test | `launch --test-knob`" in variables_markdown()
    print("ok")
''')


def test_a_new_setting_needs_only_its_declaration():
    done = subprocess.run([sys.executable, "-c", NEW_SETTING], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
