"""client/recovery.py and the server's reset: every rollback moves to an epoch no trainer or server
has seen, and a server takes only a plausible next epoch."""
import pytest

from paramshard.client.recovery import next_epoch
from paramshard.errors import ConfigError
from paramshard.mode import Mode
from paramshard.server.core.barrier import Membership
from paramshard.server.core.context import ServerContext
from paramshard.server.core.control_handlers import MAX_EPOCH_JUMP, ControlHandlers
from paramshard.server.core.waiting import WaitingList


@pytest.mark.parametrize("generations, seen, expected", [
    ([-1], 0, 1),            # the only server restarted: it knows no epoch, the trainers hold 0
    ([-1, -1], 3, 4),        # every server restarted after three rollbacks
    ([2, -1], 2, 3),         # one of two restarted
    ([5, 5], 2, 6),          # servers ahead of this trainer (it missed nothing it can use)
])
def test_the_new_epoch_is_past_every_server_and_this_trainer(generations, seen, expected):
    assert next_epoch(generations, seen) == expected


class FakeServer(ServerContext):
    """A real ServerContext (the handlers see nothing else of a server) that records what a reset voids."""
    def __init__(self, generation):
        super().__init__(0, Mode.SYNC, Membership(1, grace=5.0), 5.0, WaitingList("server 0", Membership(1, 5.0), 5.0),
                         epoch=generation)
        self.voided = []

    @property
    def generation(self):
        return self.epoch

    def fail_waiting(self, code, message):
        self.voided.append(code)


def reset(server, epoch, trainer=0):
    return ControlHandlers(server).handle_reset({"epoch": epoch, "trainer": trainer}, [])


def test_a_restarted_server_moves_to_the_chiefs_epoch():
    server = FakeServer(-1)
    assert reset(server, 4).fields == {"generation": 4}
    assert server.generation == 4 and server.voided == ["reset"]


@pytest.mark.parametrize("generation, epoch, match", [
    (3, 3, "already in epoch 3"),
    (3, 2, "already in epoch 3"),
    (0, 2 ** 63 - 1, "moves at most"),
    (-1, MAX_EPOCH_JUMP + 1, "moves at most"),
])
def test_a_reset_to_an_old_or_implausible_epoch_is_refused_and_changes_nothing(generation, epoch, match):
    server = FakeServer(generation)
    with pytest.raises(ConfigError, match=match):
        reset(server, epoch)
    assert server.generation == generation and server.voided == []


def test_only_the_chief_resets():
    with pytest.raises(ConfigError, match="only the chief"):
        reset(FakeServer(0), 1, trainer=1)
