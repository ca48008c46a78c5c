"""PARAMSHARD_SECRET: signed messages pass, wrong or missing signatures are refused."""
import pytest
import torch
import torch.nn as nn

import paramshard as ps
from paramshard.errors import ProtocolError, RemoteError
from paramshard.torch.trainer import Trainer
from paramshard.transport.auth import MessageAuth


def test_signing_detects_any_change():
    auth = MessageAuth("s3cret")
    frames = auth.sign([b"header", b"payload"])
    assert auth.verify(frames) == [b"header", b"payload"]
    with pytest.raises(ProtocolError, match="authentication failed"):
        auth.verify([b"header", b"payloaD", frames[-1]])
    with pytest.raises(ProtocolError, match="authentication failed"):
        MessageAuth("other").verify(frames)


def model():
    torch.manual_seed(0)
    return nn.Linear(16, 4)


def test_job_with_a_shared_secret_trains(cluster):
    c = cluster(servers=2, trainers=1, secret="s3cret")
    m = model()
    trainer = Trainer(m, ps.optim.SGD(lr=0.1), env=c.trainer_env(0))
    trainer.step(m(torch.ones(2, 16)).sum())
    assert trainer.server_stats()[0]["errors"] == 0
    trainer.close()


@pytest.mark.parametrize("secret,message", [(None, "unsigned message"), ("wrong", "authentication failed")])
def test_trainer_without_the_right_secret_is_refused_and_servers_keep_serving(cluster, secret, message):
    c = cluster(servers=1, trainers=1, secret="s3cret", timeout=10)
    with pytest.raises((RemoteError, ProtocolError), match=message):
        Trainer(model(), ps.optim.SGD(lr=0.1), env=c.trainer_env(0, secret=secret))
    trainer = Trainer(model(), ps.optim.SGD(lr=0.1), env=c.trainer_env(0))   # the right one still works
    assert trainer.server_stats()[0]["errors"] >= 1
    trainer.close()


def test_signed_trainer_against_a_server_without_secret(cluster):
    c = cluster(servers=1, trainers=1, timeout=10)
    with pytest.raises((RemoteError, ProtocolError), match="no PARAMSHARD_SECRET"):
        Trainer(model(), ps.optim.SGD(lr=0.1), env=c.trainer_env(0, secret="s3cret"))
