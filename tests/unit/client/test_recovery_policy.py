"""The recovery policy's decisions: which failures a Trainer rolls back from, and how often."""
import pytest

from paramshard.client.recovery import RecoveryPolicy
from paramshard.env import ClusterEnv
from paramshard.errors import ConfigError, RemoteError, ServerUnavailable
from paramshard.mode import Mode

GONE = ServerUnavailable("server 1 is gone")


def remote(code):
    return RemoteError("server 0", code, "as it says")


def test_recovery_is_off_without_restarts_or_checkpoints():
    assert not RecoveryPolicy(0, "/ckpt").admits(GONE)
    assert not RecoveryPolicy(3, None).admits(GONE)
    assert RecoveryPolicy(3, "/ckpt").admits(GONE)


def test_only_a_restarted_servers_errors_are_recovered_from():
    policy = RecoveryPolicy(3, "/ckpt")
    assert policy.admits(GONE)
    assert policy.admits(remote("reset")) and policy.admits(remote("peer_lost"))
    assert not policy.admits(remote("bad_request"))
    assert not policy.admits(ConfigError("a script error"))
    assert not policy.admits(ValueError("not paramshard's"))


def test_a_policy_is_spent_after_max_restarts_and_then_re_raises():
    policy = RecoveryPolicy(2, "/ckpt")
    assert [policy.take(GONE), policy.take(GONE)] == [1, 2]
    with pytest.raises(ServerUnavailable) as err:
        policy.take(GONE)
    assert err.value is GONE and policy.used == 2


def test_refused_errors_are_re_raised_unchanged():
    policy = RecoveryPolicy(2, "/ckpt")
    error = ConfigError("no")
    with pytest.raises(ConfigError) as err:
        policy.take(error)
    assert err.value is error and policy.used == 0


@pytest.mark.parametrize("mode,on", [(Mode.SYNC, True), (Mode.ASYNC, True), (Mode.COLLECTIVE, False),
                                     (Mode.HYBRID, False)])
def test_the_modes_without_checkpoints_never_roll_back(mode, on):
    env = ClusterEnv(role=None, mode=mode, max_restarts=2, checkpoint_dir="/ckpt")
    assert RecoveryPolicy.for_env(env).admits(GONE) is on
