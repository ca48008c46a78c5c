"""Collective and hybrid modes: dense gradients averaged by allreduce among the trainers.

- ``group.py``: the trainers' torch.distributed process group (trainer 0 hosts the
  store at PARAMSHARD_COLLECTIVE_ADDR; gloo on the interface of that address).
- ``data_parallel.py``: the user's model forwards through PyTorch's own
  DistributedDataParallel, so the script keeps calling ``model(x)``.
- ``allreduce_sync.py``: ``AllreduceDenseSync``, the ``DenseSync`` (paramshard/dense_sync.py)
  of these modes: the averaged gradients are applied on every trainer by the same
  update rules the servers use, so every replica holds the same values.

Nothing here talks to a parameter server: in hybrid mode the Trainer sends its
sparse tables' gradients to the servers itself (client/step.py).
"""
