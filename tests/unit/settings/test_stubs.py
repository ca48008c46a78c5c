"""settings/config_fields.pyi is the generated one, and says what with_fields makes."""
from __future__ import annotations

import dataclasses

from paramshard.launch.engines.k8s import K8sJobSpec
from paramshard.settings import stubs


def test_the_checked_in_stub_is_the_generated_one():
    assert stubs.STUB.read_text() == stubs.stub_text(), \
        "src/paramshard/settings/config_fields.pyi is stale: python -m paramshard.settings.stubs"


def test_the_stub_declares_every_generated_field_with_its_type():
    from paramshard.env import ClusterEnv
    text = stubs.stub_text()
    for setting_name, setting in ClusterEnv.__settings_fields__:
        assert f"    {setting_name}: {setting.annotation}" in text
    # a required field has no default in the stub (the checker asks for it), the others do
    assert "    role: str | None\n" in text and "    servers: tuple[str, ...] = ...\n" in text


def test_k8s_spec_names_its_settings_as_the_flags_and_manifests_do():
    # with_fields named K8S settings by their ClusterEnv field: K8sJobSpec had a dead
    # ``num_trainers`` field beside ``trainers``, accepted and never read.
    assert "num_trainers" not in {f.name for f in dataclasses.fields(K8sJobSpec)}
    assert "trainers" in {f.name for f in dataclasses.fields(K8sJobSpec)}
