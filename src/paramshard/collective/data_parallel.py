"""Run the user's model through PyTorch's own DistributedDataParallel, with the
script unchanged: it keeps calling ``model(x)``.

DDP averages gradients only for a forward that went through the DDP wrapper (the
forward arms its reducer; the backward's hooks then allreduce the gradients in
buckets, overlapped with the rest of the backward). The Trainer does not own the
script's calls, so ``model.forward`` is replaced, on this instance only, by a
function that calls the wrapper, whose module calls the original forward. Module
hooks of ``model`` still run (``model(x)`` goes through ``nn.Module.__call__``
as before). ``restore()`` puts the original forward back (close(), so an exported
or evaluated model is the plain one).

Parameters and buffers are broadcast from trainer 0 when the wrapper is built, so
every replica starts from the chief's values; buffers are not broadcast again at
each forward (``forward_sync_buffers=False``): that is a collective call, and a
forward that only one trainer makes (the chief's evaluation) would wait for the
others forever.
"""
from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel


class _CallOriginalForward(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, forward):
        super().__init__()
        self.model = model            # registered: DDP finds the parameters through it
        self._forward = forward

    def forward(self, *args, **kwargs):
        return self._forward(*args, **kwargs)


class DataParallelForward:
    def __init__(self, model: torch.nn.Module, find_unused_parameters: bool = False):
        if "forward" in vars(model):
            raise RuntimeError("this model's forward is already replaced (a second Trainer on one model?)")
        self.model = model
        original = model.forward
        ddp = DistributedDataParallel(_CallOriginalForward(model, original), forward_sync_buffers=False,
                                      find_unused_parameters=find_unused_parameters)
        self.ddp: DistributedDataParallel | None = ddp     # None after restore()
        # A plain function, not a Module: assigning a Module would register it as a child and
        # make a cycle (model -> DDP -> model) that state_dict() would follow forever.
        object.__setattr__(model, "forward", lambda *args, **kwargs: ddp(*args, **kwargs))

    def restore(self) -> None:
        """The model's own forward again; the wrapper (and its hold on the process group) is dropped."""
        vars(self.model).pop("forward", None)
        self.ddp = None
