"""geo/choose.py and geo mode's settings: which k, which bound, what is refused."""
import pytest

from paramshard.env import ClusterEnv
from paramshard.errors import ConfigError
from paramshard.geo.choose import DEFAULT_BOUND, DEFAULT_K, schedule_for
from paramshard.geo.schedule import FixedK
from paramshard.mode import Mode


def env(**fields):
    return ClusterEnv(role=None, mode="geo", **fields)


def test_geo_mode_answers():
    m = Mode.parse("GEO")
    assert m is Mode.GEO and m.has_servers and m.dense_on_servers and not m.allreduce
    assert m.server_mode is Mode.ASYNC and not m.waits_every_step and m.local_rounds and m.checkpoints
    assert not m.servers_bound_staleness and m.elastic_trainers
    assert Mode.ASYNC.servers_bound_staleness and not Mode.ASYNC.local_rounds


@pytest.mark.parametrize("fields,k,bound", [
    ({}, DEFAULT_K, DEFAULT_BOUND),
    ({"geo_k": 50}, 50, DEFAULT_BOUND),
    ({"geo_k": 5000}, 5000, 5000),                 # a hand-picked k over the default bound is the bound
    ({"geo_k": 4, "max_staleness": 8}, 4, 8),
    ({"max_staleness": 3}, 3, 3),                  # the default k is lowered to the bound
])
def test_fixed_k_and_its_bound(fields, k, bound):
    s = schedule_for(env(**fields))
    assert isinstance(s, FixedK) and (s.first_k(), s.bound) == (k, bound)


def test_geo_k_is_read_from_the_environment():
    base = {"PARAMSHARD_MODE": "geo"}
    assert ClusterEnv.from_environ({**base, "PARAMSHARD_GEO_K": "auto"}).geo_k == "auto"
    assert ClusterEnv.from_environ({**base, "PARAMSHARD_GEO_K": " 12 "}).geo_k == 12
    for bad in ("0", "-3", "fast"):
        with pytest.raises(ConfigError, match="PARAMSHARD_GEO_K"):
            ClusterEnv.from_environ({**base, "PARAMSHARD_GEO_K": bad})


@pytest.mark.parametrize("fields,words", [
    ({"mode": "async", "geo_k": 4}, "is for --mode geo"),
    ({"geo_k": 9, "max_staleness": 8}, "over --max-staleness 8"),
    ({"max_staleness": 0}, "bounds k"),
    ({"delta_dir": "/tmp/d"}, "--deltas"),
    ({"partitions": 1024}, "--partitions"),
])
def test_refused(fields, words):
    fields = {"mode": "geo", **fields}
    with pytest.raises(ConfigError, match=words):
        ClusterEnv(role=None, **fields)


def test_elastic_trainers_and_bounded_loss_are_taken():
    """--trainers MIN:MAX and --recovery bounded-loss in geo mode (docs/modes.md, GEO)."""
    assert ClusterEnv(role=None, mode="geo", min_trainers=1, num_trainers=3).min_trainers == 1
    assert ClusterEnv(role=None, mode="geo", recovery="bounded-loss").recovery == "bounded-loss"
    from paramshard.launch.api import LaunchConfig
    assert LaunchConfig(script=None, module="x", mode="geo", trainers=3, min_trainers=1,
                        check_script=False).min_trainers == 1


def test_launch_refuses_before_anything_starts():
    from paramshard.launch.api import LaunchConfig
    with pytest.raises(ConfigError, match="--partitions"):
        LaunchConfig(script=None, module="x", mode="geo", partitions=64, check_script=False)
    assert LaunchConfig(script=None, module="x", mode="geo", geo_k=7, check_script=False).geo_k == 7


def test_auto_k_takes_the_bound():
    from paramshard.geo import auto_k
    s = schedule_for(env(geo_k="auto", max_staleness=64))
    assert isinstance(s, auto_k.AutoK) and s.bound == 64 and 1 <= s.first_k() <= 64
    assert schedule_for(env(geo_k="auto")).bound == DEFAULT_BOUND == auto_k.DEFAULT_BOUND


@pytest.mark.parametrize("mode,gated", [("geo", None), ("async", 5)])
def test_servers_gate_pushes_by_max_staleness_in_async_mode_only(mode, gated):
    """In geo mode --max-staleness bounds k on the trainers; a server gating a trainer's round by
    its step (SSP) would hold a trainer that sends every k steps for no reason."""
    from paramshard.server.assembly import build_server
    server = build_server(ClusterEnv(role=None, server_id=0, mode=mode, max_staleness=5), num_trainers=1,
                          watch_peers=False, in_process=True)
    try:
        assert server.mode is Mode.ASYNC and server.dense.clocks.bound == gated
    finally:
        server.close()
