"""A trainer that reports how its job is secured: a fingerprint of PARAMSHARD_SECRET (None
without one), whether a client without keys (what any local process could run) is
served or refused by the job's servers, and then one real training step.
Used by the tests of the launchers' default secret (test_launch_cli, test_run_torchrun_mpi)."""
import hashlib
import os

import torch
import torch.nn as nn

import paramshard as ps
from paramshard.transport.links import ServerLinks
from paramshard.transport.security import HandshakeRefused

env = ps.init()
secret = os.environ.get("PARAMSHARD_SECRET")
print(f"trainer {env.trainer_id} secret", hashlib.sha256(secret.encode()).hexdigest()[:16] if secret else None,
      flush=True)
plain = ServerLinks(env.servers, 20, who="a plain client")
try:
    plain.wait_ready(20)
    print(f"trainer {env.trainer_id} plain client served", flush=True)
except HandshakeRefused as exc:
    print(f"trainer {env.trainer_id} plain client refused:", exc, flush=True)
finally:
    plain.close()
model = nn.Linear(4, 2)
with ps.Trainer(model, ps.optim.SGD(lr=0.1)) as trainer:
    trainer.step(model(torch.ones(2, 4)).sum())
print(f"trainer {env.trainer_id} trained", flush=True)
