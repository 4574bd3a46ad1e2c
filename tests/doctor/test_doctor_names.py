"""Following the script's own names to the torch objects they stand for."""

from __future__ import annotations

import ast

import pytest

from ringtrain.doctor.names import Names
from ringtrain.doctor.script import Script


def concept_of_last_call(source: str) -> str | None:
    tree = ast.parse(source)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    last = max(calls, key=lambda c: (c.lineno, c.col_offset))
    return Names(tree).concept(last)


@pytest.mark.parametrize(
    "source, concept",
    [
        ("import torch.distributed as D\nD.init_process_group('gloo')", "init_process_group"),
        ("from torch import distributed as dist\ndist.init_process_group('gloo')", "init_process_group"),
        ("from torch.distributed import init_process_group\ninit_process_group('gloo')", "init_process_group"),
        ("from torch.utils.data.distributed import DistributedSampler as DS\nDS(ds)", "DistributedSampler"),
        ("from torch.utils.data import DistributedSampler\nDistributedSampler(ds)", "DistributedSampler"),
        ("import torch.utils.data as tud\ntud.distributed.DistributedSampler(ds)", "DistributedSampler"),
        ("from monai.data import DistributedSampler\nDistributedSampler(ds, even_divisible=True)", "DistributedSampler"),
        ("from torch.nn.parallel import DistributedDataParallel as DDP\nDDP(m)", "DDP"),
        ("from torch import nn\nnn.parallel.DistributedDataParallel(m)", "DDP"),
        ("import torch.nn as nn\nnn.parallel.DistributedDataParallel(m)", "DDP"),
        ("import torch\ntorch.nn.parallel.distributed.DistributedDataParallel(m)", "DDP"),
        ("import torch\nDDP = torch.nn.parallel.DistributedDataParallel\nWrap = DDP\nWrap(m)", "DDP"),
        ("import torch\nP = torch.nn.parallel\nP.DistributedDataParallel(m)", "DDP"),
        ("from torch.nn.parallel import DataParallel as DP\nDP(m)", "DP"),
        ("import torch\ntorch.nn.DataParallel(m)", "DP"),
        ("from torch.utils.data import *\nDataLoader(ds)", "DataLoader"),
        ("def main():\n    import torch.distributed as dist\n    dist.all_reduce(t)", "collective.all_reduce"),
        ("from torch import save as tsave\ntsave(x, 'a.pt')", "save"),
        ("import torch\nSBN = torch.nn.SyncBatchNorm\nSBN.convert_sync_batchnorm(m)", "convert_sync_batchnorm"),
        ("import horovod.torch as hvd\nhvd.DistributedOptimizer(opt)", "hvd.DistributedOptimizer"),
        ("from horovod import torch as hvd\nhvd.size()", "hvd.size"),
        ("import ringtrain.horovod as hvd\nhvd.DistributedOptimizer(opt)", "hvd.DistributedOptimizer"),
        ("import torch.multiprocessing as mp\nmp.spawn(main, nprocs=2)", "spawn"),
        ("from torch.distributed.fsdp import fully_shard\nfully_shard(layer)", "fully_shard"),
        ("from torch.distributed._composable.fsdp import fully_shard as shard\nshard(m)", "fully_shard"),
        ("import torch.distributed.fsdp as F\nF.fully_shard(m)", "fully_shard"),
        ("from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\nFSDP(m)", "FSDP"),
        ("import torch\ntorch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel(m)", "FSDP"),
        ("from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\nFSDP.optim_state_dict(m, o)",
         "FSDP.optim_state_dict"),
        ("from torch.distributed.checkpoint import state_dict as S\nS.get_model_state_dict(m)", "get_model_state_dict"),
        # A snippet that never imports `torch` or `dist` means the usual ones.
        ("torch.save(x, 'a.pt')", "save"),
        ("dist.init_process_group('nccl')", "init_process_group"),
        ("fully_shard(model)", "fully_shard"),
        ("model = FSDP(model)", "FSDP"),
    ],
)
def test_aliases_resolve_to_the_torch_object(source, concept):
    assert concept_of_last_call(source) == concept


@pytest.mark.parametrize(
    "source",
    [
        # the script's own class of the same name is not torch's
        "class DistributedSampler:\n    pass\nDistributedSampler(ds)",
        # a local variable named like a module is not that module
        "dist = {}\ndist.get('a')",
        "import numpy as torch\ntorch.save(x)",
        "from functools import reduce\nreduce(f, xs)",
        "model.save('a.pt')",
        # a package's own class imported relatively (ringtrain's strategies) is not FSDP1
        "from .fsdp import FSDP\nFSDP()",
    ],
)
def test_other_objects_are_not_mistaken_for_torch(source):
    assert concept_of_last_call(source) is None


def script(source: str) -> Script:
    return Script("t.py", source, ast.parse(source))


def name_at(s: Script, line: int, name: str) -> ast.Name:
    return next(n for n in s.nodes if isinstance(n, ast.Name) and n.id == name and n.lineno == line)


def test_values_follow_plain_assignments_conditionals_and_loops():
    s = script(
        "a = make()\n"
        "b = a\n"
        "c = b if flag else None\n"
        "for d in (c, other):\n"
        "    use(d)\n"
    )
    origins = s.origins(name_at(s, 5, "d"))
    assert any(isinstance(o, ast.Call) and o.func.id == "make" for o in origins)
    assert any(isinstance(o, ast.Constant) and o.value is None for o in origins)
    assert s.aliases(name_at(s, 5, "d")) >= {(s.tree, "a"), (s.tree, "b"), (s.tree, "c"), (s.tree, "other")}


def test_scopes_keep_function_locals_apart_and_see_closures():
    s = script(
        "x = 1\n"
        "def f():\n"
        "    x = 2\n"
        "    return x\n"
        "def g():\n"
        "    return x\n"
        "def outer():\n"
        "    y = 3\n"
        "    def inner():\n"
        "        return y\n"
    )
    f_x, g_x, inner_y = name_at(s, 4, "x"), name_at(s, 6, "x"), name_at(s, 10, "y")
    assert s.scope_of(f_x) != s.scope_of(g_x)
    assert s.scope_of(g_x) == (s.tree, "x")
    assert [v.value for v in s.values(f_x)] == [2]
    assert [v.value for v in s.values(inner_y)] == [3]  # the enclosing function's binding


def test_self_attributes_belong_to_their_class():
    s = script(
        "class T:\n"
        "    def __init__(self):\n"
        "        self.loader = build()\n"
        "    def run(self):\n"
        "        for b in self.loader:\n"
        "            pass\n"
    )
    use = next(n for n in s.nodes if isinstance(n, ast.Attribute) and n.attr == "loader" and n.lineno == 5)
    (value,) = s.values(use)
    assert isinstance(value, ast.Call) and value.func.id == "build"


def test_arguments_reach_a_parameter_through_calls_and_class_construction():
    s = script(
        "def save(state, path):\n"
        "    write(state)\n"
        "class T:\n"
        "    def __init__(self, model):\n"
        "        self.model = model\n"
        "save({'a': 1}, 'p')\n"
        "T(net)\n"
        "torch.save(x, 'q')\n"
    )
    (state,) = s.arguments(name_at(s, 2, "state"))
    assert isinstance(state, ast.Dict)
    (model,) = s.arguments(name_at(s, 5, "model"))
    assert model.id == "net"
    # torch.save(...) is torch's, never this file's `def save`
    assert [c.lineno for c in s.callers(s.defs["save"][0])] == [6]


def test_returned_values_and_items_stored_by_subscript():
    s = script(
        "def build():\n"
        "    return make()\n"
        "model = build()\n"
        "ckpt = {}\n"
        "ckpt['model'] = model.state_dict()\n"
    )
    call = next(n for n in s.nodes if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "build")
    (value,) = s.returned(call)
    assert value.func.id == "make"
    (stored,) = s.stored_items[(s.tree, "ckpt")]
    assert stored.func.attr == "state_dict"
