"""The one 2-rank job of comm/'s own tests (tests/comm; importable by the launched ranks): what needs
a real peer — Adasum's pairwise exchange, a real descriptor all_gather, process sets bound on a real
group, a parameter with a gradient on one rank only. One launch: process start dominates."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ringtrain.comm import adasum, checks, reduce
from ringtrain.comm.checks import Call, Kind
from ringtrain.comm.grad_sync import GradientSync
from ringtrain.comm.groups import ProcessSet, ProcessSetTable

ADASUM_SIZES = [3, 2]


def adasum_input(rank: int) -> list[torch.Tensor]:
    flat = [torch.tensor([1.0, 2.0, 0.0, 3.0, -1.0]), torch.tensor([2.0, -1.0, 1.0, 1.0, 4.0])][rank]
    return [flat[:3].clone(), flat[3:].clone()]


def batch(rank: int) -> torch.Tensor:
    return torch.tensor([[1.0, 2.0], [3.0, 4.0]]) * (rank + 1)


def model() -> nn.ModuleDict:
    torch.manual_seed(0)
    return nn.ModuleDict({"a": nn.Linear(2, 1), "b": nn.Linear(2, 1), "unused": nn.Linear(2, 1)})


def _error(fn) -> str:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test reads the text
        return f"{type(e).__name__}: {e}"
    return "no error"


def two_ranks() -> dict:
    dist.init_process_group("gloo")
    r = dist.get_rank()
    out: dict = {}
    everyone = ProcessSet(None)
    everyone.bind()

    work = adasum_input(r)
    adasum.adasum_(work, everyone)
    out["adasum"] = torch.cat(work)

    rows = checks.exchange(everyone, Call(Kind.ALLGATHER, torch.float32, shape=(r + 1, 2), agree="(2,)", aux=r + 1))
    out["rows"] = [(int(row.kind), row.aux, row.dims[:2]) for row in rows]
    out["rounds"] = everyone.check_rounds

    table = ProcessSetTable()
    out["outside"] = _error(lambda: table.add([0, 5]))
    out["never_added"] = _error(lambda: reduce.allreduce(torch.ones(1), process_set=ProcessSet([0, 1])))
    only_1 = table.add([1])
    out["only_1"] = (only_1.process_set_id, only_1.size(), only_1.rank(), only_1.included())
    out["not_member"] = _error(lambda: reduce.allreduce(torch.ones(1), process_set=only_1).wait()) if r == 0 else \
        reduce.allreduce(torch.full((1,), 7.0), op=1, process_set=only_1).wait().item()
    out["removed"] = (table.remove(only_1), table.remove(only_1))

    m = model()
    sync = GradientSync(m.parameters(), process_set=everyone, check=True)
    rounds = []
    for _ in range(2):
        loss = m["a"](batch(r)).sum() + (m["b"](batch(r)).sum() if r == 1 else 0)
        loss.backward()
        before = everyone.check_rounds
        sync.synchronize()
        rounds.append(everyone.check_rounds - before)
        grads = {name: None if p.grad is None else p.grad.clone() for name, p in m.named_parameters()}
        for p in m.parameters():
            p.grad = None
    out["grads"], out["grad_rounds"] = grads, rounds
    dist.destroy_process_group()
    return out
