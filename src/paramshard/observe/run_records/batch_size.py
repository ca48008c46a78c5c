"""Samples per step, as the trainer's watchers count them: the first dimension of the
first tensor a model's forward gets (Trainer.step is never told the batch size)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from torch.nn import Module
    from torch.utils.hooks import RemovableHandle


def first_tensor(obj):
    """The first tensor in a forward's arguments (nested lists, tuples and dicts), or None."""
    if hasattr(obj, "shape") and hasattr(obj, "dim"):      # a torch.Tensor, without importing torch here
        return obj
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        for item in obj:
            found = first_tensor(item)
            if found is not None:
                return found
    return None


def watch_batch_size(model: Module, note: Callable[[int], None]) -> RemovableHandle:
    """Call ``note(samples)`` before each forward of ``model``; returns the hook handle."""
    def pre_hook(module, args, kwargs):
        found = first_tensor(args) if args else first_tensor(kwargs)
        if found is not None and found.dim() > 0:
            note(int(found.shape[0]))
    return model.register_forward_pre_hook(pre_hook, with_kwargs=True)
