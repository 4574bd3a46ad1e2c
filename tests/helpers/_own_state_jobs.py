"""Jobs for issue 36's per-rank state and the Ring's own traps (spawned ranks import them by name)."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import pathlib
from fractions import Fraction

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import ringtrain as rt
from ringtrain.errors import RingtrainError


class Position:
    """A script's own loader position: state_dict / load_state_dict."""

    def __init__(self, start: int) -> None:
        self.at = start

    def state_dict(self) -> dict:
        return {"at": self.at}

    def load_state_dict(self, state: dict) -> None:
        self.at = state["at"]


class Phase(enum.Enum):
    WARMUP = 1
    MAIN = 2


@dataclasses.dataclass
class Best:
    loss: np.float64
    when: datetime.datetime
    path: pathlib.Path


def _ring_and_model(**kwargs):
    ring = rt.Ring(seed=0, **kwargs)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    return ring, model, optimizer


def save_own_state(path: str, shared_only: bool = False) -> dict:
    """Each rank sets its own extras and keeps its own position; saved, then changed; loaded back: what each has."""
    ring, model, optimizer = _ring_and_model()
    position = ring.keep(Position(0 if shared_only else 100 * ring.rank), name="loader")
    r = ring.rank
    ring.extras["shared"] = np.float64(0.25)  # the same on every rank
    if not shared_only:
        ring.extras["mine"] = np.int64(10 + r)
        ring.extras["best"] = Best(np.float64(1.5 + r), datetime.datetime(2026, 12, 1, 12, r), pathlib.Path(f"/r{r}"))
        ring.extras["phase"] = Phase.MAIN
        ring.extras["frac"] = Fraction(1, 3 + r)
        if ring.is_main:
            ring.extras["rank0_only"] = "zero"
    position.at += 7
    ring.save(path, model=model, optimizer=optimizer)
    ring.extras.clear()
    position.at = -1
    ring.load(path, model=model, optimizer=optimizer)
    got = {"extras": dict(ring.extras), "position": position.at}
    ring.close()
    return got


def load_at_one_process(path: str) -> dict:
    """The checkpoint of 2 ranks, resumed by one process: what follows and what is refused."""
    ring, model, optimizer = _ring_and_model()
    position = ring.keep(Position(-1), name="loader")
    try:
        ring.load(path, model=model, optimizer=optimizer)
        return {"extras": dict(ring.extras), "position": position.at}
    except RingtrainError as e:
        return {"error": str(e)}
    finally:
        ring.close()


def bad_extra_refused(path: str) -> dict:
    """A value the safe reader would refuse: at the assignment; mutated in later: at the save (nothing written)."""
    ring, model, optimizer = _ring_and_model()
    out = {}
    try:
        ring.extras["fn"] = lambda: 0
    except RingtrainError as e:
        out["assign"] = str(e)
    ring.extras["log"] = [1, 2]
    ring.extras["log"].append(object())
    try:
        ring.save(path, model=model)
    except RingtrainError as e:
        out["save"] = str(e)
    ring.close()
    return out


def loss_backward_under_accumulate() -> str:
    """``loss.backward()`` instead of ``ring.backward(loss)`` with accumulate=4: the first step raises."""
    ring, model, optimizer = _ring_and_model(accumulate=4)
    try:
        for _ in range(8):
            F.mse_loss(model(torch.randn(3, 4)), torch.zeros(3, 2)).backward()
            optimizer.step()
            optimizer.zero_grad()
        return f"no error after {ring.optimizer_steps} steps"
    except RingtrainError as e:
        return str(e)
    finally:
        ring.close()


def optimizer_not_given_under_fsdp() -> str:
    """FSDP, an optimizer built on the model before ring.setup and not given to it: its first step raises."""
    ring = rt.Ring("fsdp", seed=0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model = ring.setup(model)
    try:
        ring.backward(F.mse_loss(model(torch.randn(3, 4)), torch.zeros(3, 2)))
        optimizer.step()
        return "no error"
    except RingtrainError as e:
        return str(e)
    finally:
        ring.close()


def plain_loader_under_ddp(use_ring_loader: bool = False) -> int:
    """A plain DataLoader (every rank reads all 96 samples) under DDP: one warning at the first backward."""
    ring, model, optimizer = _ring_and_model(strategy="ddp")
    data = TensorDataset(torch.randn(96, 4), torch.randn(96, 2))
    train_loader = ring.loader(data, batch_size=8, shuffle=True) if use_ring_loader else \
        DataLoader(data, batch_size=8, shuffle=True)
    steps = 0
    for x, y in train_loader:
        ring.backward(F.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
        steps += 1
    ring.close()
    return steps
