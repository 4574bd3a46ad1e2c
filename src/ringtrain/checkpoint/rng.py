"""Every random number generator of this process, captured and restored: torch (CPU, and CUDA where it is
in use), numpy and Python's ``random``, as tensors and plain values (a checkpoint reads them back with
``weights_only=True``)."""

from __future__ import annotations

import random
from typing import Any, Mapping

import numpy as np
import torch


def capture_rng() -> dict[str, Any]:
    """This process's RNG states as tensors and plain Python (safe for weights_only loading)."""
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "gauss": float(np_state[4]),
        },
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"].cpu())
    np_state = state["numpy"]
    np.random.set_state(
        ("MT19937", np_state["keys"].cpu().numpy().astype(np.uint32), np_state["pos"], np_state["has_gauss"], np_state["gauss"])
    )
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all([s.cpu() for s in cuda_states])
