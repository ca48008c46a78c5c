"""The schema of a trainer's position file (trainers/step-N/trainer-K.json).

Written by paramshard.trainer.position.capture and given back to
restore_random_streams on resume: a damaged or hostile file must be one
CheckpointError naming the field before any of it reaches torch, numpy or
``random`` (whose own errors are tracebacks, and whose state setters would take
whatever they are given).
"""
from __future__ import annotations

import base64
import binascii

from paramshard.checkpoint.errors import CheckpointError
from paramshard.checkpoint.manifest_schema import Invalid, array, integer, obj, show

MT_WORDS = 624                      # Mersenne Twister state: numpy's and Python's generators
MAX_TORCH_STATE = 1 << 20           # base64 characters of torch's CPU generator state (5056 bytes today)


def _float(value, what: str):
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise Invalid(f"{what} must be a number, got {show(value)}")


def _b64(value, what: str, limit: int) -> bytes:
    if not isinstance(value, str) or len(value) > limit:
        raise Invalid(f"{what} must be a base64 string of at most {limit} characters")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise Invalid(f"{what} is not base64 ({exc})") from None


def _torch_state_bytes() -> int | None:
    """Bytes of torch's CPU generator state here (None without torch: nothing to compare)."""
    try:
        import torch
    except ImportError:
        return None
    return int(torch.get_rng_state().numel())


def _check_rng(rng: dict) -> None:
    obj(rng, "rng", ("torch", "numpy", "python"))
    state = _b64(rng["torch"], "rng.torch", MAX_TORCH_STATE)
    expected = _torch_state_bytes()
    if expected is not None and len(state) != expected:
        raise Invalid(f"rng.torch holds {len(state)} bytes, torch's generator state here is {expected}")
    numpy_state = array(rng["numpy"], "rng.numpy")
    if len(numpy_state) != 5 or numpy_state[0] != "MT19937":
        raise Invalid(f"rng.numpy must be ['MT19937', keys, pos, has_gauss, cached], got {show(numpy_state)}")
    if len(_b64(numpy_state[1], "rng.numpy keys", 8 * MT_WORDS)) != 4 * MT_WORDS:
        raise Invalid(f"rng.numpy keys must be {MT_WORDS} 32-bit words")
    integer(numpy_state[2], "rng.numpy pos", 0, MT_WORDS)
    integer(numpy_state[3], "rng.numpy has_gauss", 0, 1)
    _float(numpy_state[4], "rng.numpy cached")
    python_state = array(rng["python"], "rng.python")
    if len(python_state) != 3:
        raise Invalid(f"rng.python must be [version, internal state, gauss], got {show(python_state)}")
    integer(python_state[0], "rng.python version", 1, 3)
    internal = array(python_state[1], "rng.python internal state")
    if len(internal) != MT_WORDS + 1:
        raise Invalid(f"rng.python internal state must hold {MT_WORDS + 1} numbers, got {len(internal)}")
    for i, word in enumerate(internal[:-1]):
        integer(word, f"rng.python internal state[{i}]", 0, 0xFFFFFFFF)
    integer(internal[-1], "rng.python internal position", 0, MT_WORDS)
    _float(python_state[2], "rng.python gauss")


def check_position(position, step: int, where) -> dict:
    """``position`` (parsed JSON of ``where``) when it is a trainer position of checkpoint ``step``."""
    try:
        obj(position, "the position", ("step", "state"))
        if integer(position["step"], "step") != step:
            raise Invalid(f"step is {position['step']}, the checkpoint's is {step}")
        obj(position["state"], "state")        # the script's own JSON: its content is the script's
        if "stream" in position:
            obj(position["stream"], "stream")  # a live stream's position: its source's seek checks the rest
        if "rng" in position:
            _check_rng(position["rng"])
    except Invalid as exc:
        raise CheckpointError(f"{where}: {exc} (a damaged trainer position: delete the file to resume this "
                              f"trainer without it, or use another checkpoint)") from None
    return position
