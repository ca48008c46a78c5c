"""Trainer errors that say what to do, and the close-at-exit safety net (no servers needed)."""
import atexit
import gc
import logging
import weakref

import pytest

from paramshard.client.recovery import RecoveryPolicy
from paramshard.client.step import StepClient
from paramshard.env import ClusterEnv
import torch

import paramshard as ps
from paramshard import runtime
from paramshard.errors import ConfigError, ServerUnavailable
from paramshard.trainer import trainer as trainer_module
from paramshard.trainer.backends.servers import ServerBackend
from paramshard.trainer.progress import TrainerProgress
from paramshard.trainer.trainer import Trainer


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to find or reach servers fails the test."""
    def forbidden(*args, **kwargs):
        raise AssertionError("Trainer touched the network before checking its optimizer")
    monkeypatch.setattr(runtime, "current", forbidden)
    monkeypatch.setattr(runtime, "links_for", forbidden)


def model():
    return torch.nn.Linear(3, 2)


def suggestion(message: str) -> str:
    return message.split("use optimizer=", 1)[1]


@pytest.mark.parametrize("make,expected", [
    (lambda p: torch.optim.SGD(p, lr=0.1), "ps.optim.SGD(lr=0.1, weight_decay=0)"),
    (lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-4),
     "ps.optim.Momentum(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.0001)"),
    (lambda p: torch.optim.Adam(p, lr=2e-3, betas=(0.8, 0.99), eps=1e-6),
     "ps.optim.Adam(lr=0.002, betas=(0.8, 0.99), eps=1e-06, weight_decay=0)"),
    (lambda p: torch.optim.Adagrad(p, lr=0.3, lr_decay=0.01, initial_accumulator_value=0.1),
     "ps.optim.Adagrad(lr=0.3, lr_decay=0.01, initial_accumulator_value=0.1, eps=1e-10, weight_decay=0)"),
])
def test_torch_optimizer_is_refused_with_the_ps_optim_equivalent(no_network, make, expected):
    m = model()
    with pytest.raises(ConfigError) as err:
        Trainer(m, optimizer=make(m.parameters()))
    message = str(err.value)
    assert "optimizers run on the parameter servers" in message
    assert suggestion(message) == expected
    # The suggestion is a working config with the same settings.
    config = eval(expected, {"ps": ps})
    assert isinstance(config, ps.optim.OptimizerConfig)


def test_torch_optimizer_without_equivalent_lists_the_choices(no_network):
    m = model()
    with pytest.raises(ConfigError) as err:
        Trainer(m, optimizer=torch.optim.RMSprop(m.parameters(), lr=0.01))
    message = str(err.value)
    assert "torch.optim.RMSprop has no paramshard equivalent" in message
    for name in ("SGD", "Momentum", "Adagrad", "Adam", "FTRL"):
        assert f"ps.optim.{name}" in message


@pytest.mark.parametrize("optimizer,fragment", [
    ("adam", "Trainer(optimizer='adam'): expected a ps.optim config"),
    (0.1, "Trainer(optimizer=0.1): expected a ps.optim config"),
    (ps.optim.Adam, "Trainer(optimizer=ps.optim.Adam): pass an instance"),
])
def test_anything_else_is_refused_clearly(no_network, optimizer, fragment):
    with pytest.raises(ConfigError) as err:
        Trainer(model(), optimizer=optimizer)
    assert fragment in str(err.value)
    assert "to_wire" not in str(err.value)


class FakeLinks:
    def __init__(self, fail=False):
        self.fail, self.timeouts, self.closed = fail, [], False

    def __len__(self):
        return 1

    def live(self):
        return [0]

    def request_many(self, requests, timeout=None):
        self.timeouts.append(timeout)
        if self.fail:
            raise ServerUnavailable("server 0 is gone")
        return {0: ({"ok": True}, [])}

    def close(self):
        self.closed = True


def bare_trainer(links, trainer_id=1):
    """A Trainer as __init__ leaves it, minus the servers."""
    t = Trainer.__new__(Trainer)
    t.trainer_id, t.links, t._closed = trainer_id, links, False
    t._exit_hook = None
    t.env = ClusterEnv(role=None)          # no checkpoint directory: close() only leaves
    t.progress = TrainerProgress(trainer_id, RecoveryPolicy(0))
    t.steps = StepClient(links, dense=None, sparse=None)    # nothing in flight
    t.backend = ServerBackend(t.env, links, None, None, None, t.steps)
    return t


@pytest.fixture
def warnings_logged():
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("paramshard.trainer")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def test_exit_hook_closes_an_open_trainer_once_with_a_warning(warnings_logged):
    links = FakeLinks()
    t = bare_trainer(links, trainer_id=1)
    trainer_module._close_at_exit(weakref.ref(t))
    trainer_module._close_at_exit(weakref.ref(t))     # already closed: nothing more
    assert t._closed and links.closed
    assert links.timeouts == [trainer_module.EXIT_CLOSE_TIMEOUT]
    messages = [r.getMessage() for r in warnings_logged if r.levelno == logging.WARNING]
    assert messages == ["trainer 1: close() was not called; closing at exit "
                        "(use `with ps.Trainer(...) as trainer:` or call trainer.close())"]


def test_exit_hook_swallows_errors_when_servers_are_gone(warnings_logged):
    links = FakeLinks(fail=True)
    t = bare_trainer(links)
    trainer_module._close_at_exit(weakref.ref(t))     # must not raise
    assert links.closed


def test_exit_hook_does_nothing_after_close_or_for_a_collected_trainer(warnings_logged):
    links = FakeLinks()
    t = bare_trainer(links)
    t.close()
    trainer_module._close_at_exit(weakref.ref(t))
    assert links.timeouts == [10]
    gone = bare_trainer(FakeLinks())
    ref = weakref.ref(gone)
    del gone
    gc.collect()
    trainer_module._close_at_exit(ref)
    assert not [r for r in warnings_logged if r.levelno == logging.WARNING]


def test_close_and_with_unregister_the_exit_hook(monkeypatch):
    registered = []
    monkeypatch.setattr(atexit, "unregister", registered.append)
    t = bare_trainer(FakeLinks())
    t._exit_hook = object()
    with t as same:
        assert same is t
    assert t._closed and registered == [t._exit_hook]
