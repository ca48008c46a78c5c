"""A trainer's place in its data and its random streams, as JSON (saved with every checkpoint).

What a resumed trainer needs to continue exactly where it stopped: its step,
whatever the script says of its data (file, offset, epoch: ``state``), and the
random generators a script or a DataLoader's shuffle draws from (torch,
numpy's global generator, Python's ``random``).
"""
from __future__ import annotations

import base64
import random

import numpy as np
import torch


def capture(step: int, state: dict | None = None) -> dict:
    np_state = np.random.get_state()
    # The legacy tuple: numpy's global generator is always an MT19937 (a dict only for other bit generators).
    assert isinstance(np_state, tuple), f"numpy's global random state is {type(np_state).__name__}, not MT19937's"
    py_version, py_internal, py_gauss = random.getstate()
    return {
        "step": step,
        "state": state or {},
        "rng": {
            "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
            "numpy": [np_state[0], base64.b64encode(np_state[1].tobytes()).decode(), int(np_state[2]),
                      int(np_state[3]), float(np_state[4])],
            "python": [py_version, list(py_internal), py_gauss],
        },
    }


def restore_random_streams(position: dict) -> None:
    rng = position.get("rng")
    if not rng:
        return
    torch.set_rng_state(torch.from_numpy(np.frombuffer(base64.b64decode(rng["torch"]), np.uint8).copy()))
    name, keys, pos, has_gauss, cached = rng["numpy"]
    np.random.set_state((name, np.frombuffer(base64.b64decode(keys), np.uint32).copy(), pos, has_gauss, cached))
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
