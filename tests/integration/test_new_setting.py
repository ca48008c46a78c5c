"""A new setting, declared in one place, reaches the environment contract, the launcher, the
commands' flags, the Kubernetes manifests and the docs (moved from tests/unit: it runs in a
Python process of its own, so that the declaration cannot leak into the test process)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).parents[2]


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
    import paramshard.cli.jobs.launch, paramshard.cli.jobs.run, paramshard.cli.jobs.k8s
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
    args = parse(paramshard.cli.jobs.launch, ["--test-knob", "11", "-m", "m"])
    outer = ClusterEnv.from_environ({})
    assert launch_fields(args, "launch", outer)["test_knob"] == 11
    args = parse(paramshard.cli.jobs.run, ["--servers", "1", "--test-knob", "12", "-m", "m"])
    assert contract_changes(args, "run")["test_knob"] == 12
    args = parse(paramshard.cli.jobs.k8s, ["--trainers", "1", "--image", "i", "--test-knob", "13", "-m", "m"])
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
