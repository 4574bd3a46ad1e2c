"""Which torch object a name in the script means, through its imports and aliases.

A script may write ``DDP(model)``, ``D.init_process_group``, ``nn.parallel.DistributedDataParallel``
or ``from torch.utils.data import DistributedSampler as DS``; rules ask one question:
"is this call a DistributedDataParallel wrap?" (:meth:`Names.concept`). Imports anywhere in
the file count (tutorials import inside ``main`` or under ``if __name__``), and so do plain
aliases like ``DDP = torch.nn.parallel.DistributedDataParallel``.

Tutorial snippets often use ``torch``, ``nn``, ``dist`` or ``hvd`` without importing them;
a name the file never binds is read with its customary meaning (:data:`CUSTOMARY`).
"""

from __future__ import annotations

import ast

# FSDP1's wrapper class: FullyShardedDataParallel(module, auto_wrap_policy=..., ...).
FSDP1_CLASS = (
    "torch.distributed.fsdp.FullyShardedDataParallel",
    "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel",
)

# The same object under several public paths; every path maps to one concept name.
CONCEPTS: dict[str, tuple[str, ...]] = {
    "DistributedSampler": (
        "torch.utils.data.DistributedSampler",
        "torch.utils.data.distributed.DistributedSampler",
        # MONAI's subclass (same padding and set_epoch), used by the MONAI tutorials.
        "monai.data.DistributedSampler",
        "monai.data.samplers.DistributedSampler",
    ),
    "DataLoader": (
        "torch.utils.data.DataLoader",
        "torch.utils.data.dataloader.DataLoader",
        "monai.data.DataLoader",
        "monai.data.dataloader.DataLoader",
    ),
    "DDP": (
        "torch.nn.parallel.DistributedDataParallel",
        "torch.nn.parallel.distributed.DistributedDataParallel",
    ),
    "DP": (
        "torch.nn.DataParallel",
        "torch.nn.parallel.DataParallel",
        "torch.nn.parallel.data_parallel.DataParallel",
    ),
    "save": ("torch.save", "torch.serialization.save"),
    "load": ("torch.load", "torch.serialization.load"),
    "init_process_group": (
        "torch.distributed.init_process_group",
        "torch.distributed.distributed_c10d.init_process_group",
    ),
    "set_device": (
        "torch.cuda.set_device",
        "torch.cuda.device",  # `with torch.cuda.device(i):` sets the current device too
        "torch.accelerator.set_device_index",
        "torch.accelerator.set_device_idx",
    ),
    "convert_sync_batchnorm": (
        "torch.nn.SyncBatchNorm.convert_sync_batchnorm",
        "torch.nn.modules.batchnorm.SyncBatchNorm.convert_sync_batchnorm",
        "torch.nn.modules.SyncBatchNorm.convert_sync_batchnorm",
    ),
    "spawn": (
        "torch.multiprocessing.spawn",
        "torch.multiprocessing.start_processes",
        "torch.multiprocessing.spawn.spawn",
    ),
    # Sharded training. FSDP2 (fully_shard) also lives under its pre-2.6 path, torch.distributed._composable.
    "fully_shard": (
        "torch.distributed.fsdp.fully_shard",
        "torch.distributed.fsdp._fully_shard.fully_shard",
        "torch.distributed.fsdp._fully_shard._fully_shard.fully_shard",
        "torch.distributed._composable.fsdp.fully_shard",
        "torch.distributed._composable.fsdp.fully_shard.fully_shard",
    ),
    "FSDP": FSDP1_CLASS,
    "get_model_state_dict": ("torch.distributed.checkpoint.state_dict.get_model_state_dict",),
    "get_optimizer_state_dict": ("torch.distributed.checkpoint.state_dict.get_optimizer_state_dict",),
    "get_state_dict": ("torch.distributed.checkpoint.state_dict.get_state_dict",),
    "StateDictOptions": ("torch.distributed.checkpoint.state_dict.StateDictOptions",),
    "hvd.DistributedOptimizer": ("horovod.torch.DistributedOptimizer",),
    "hvd.size": ("horovod.torch.size", "horovod.torch.local_size"),
    "hvd.init": ("horovod.torch.init",),
    # Random draws that decide which samples a dataset holds: the same on every rank only when
    # their generator is seeded alike.
    "random_split": ("torch.utils.data.random_split", "torch.utils.data.dataset.random_split"),
    "randperm": ("torch.randperm",),
    "np.permutation": ("numpy.random.permutation", "numpy.random.shuffle", "numpy.random.choice"),
    "random.shuffle": ("random.shuffle", "random.sample"),
    "Subset": ("torch.utils.data.Subset", "torch.utils.data.dataset.Subset",
               "torch.utils.data.SubsetRandomSampler", "torch.utils.data.sampler.SubsetRandomSampler"),
    # ringtrain's own Ring, for the rules about scripts that use it (rules/ring.py).
    "Ring": ("ringtrain.Ring", "ringtrain.ring.Ring"),
}

# torch.distributed collectives every rank of the group must call (send/recv and barrier
# are left out: point-to-point calls are rank-specific by design, and the "rank 0 first"
# idiom pairs a barrier under `rank != 0` with one under `rank == 0`).
COLLECTIVES = (
    "all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "gather",
    "gather_object", "broadcast", "broadcast_object_list", "scatter", "scatter_object_list",
    "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
)
for _op in COLLECTIVES:
    CONCEPTS["collective." + _op] = ("torch.distributed." + _op,)
HOROVOD_COLLECTIVES = ("allreduce", "allreduce_", "allgather", "broadcast", "broadcast_", "alltoall",
                       "reducescatter", "grouped_allreduce", "broadcast_object", "allgather_object")
for _op in HOROVOD_COLLECTIVES:
    CONCEPTS["collective.hvd." + _op] = ("horovod.torch." + _op,)
# FSDP1's optimizer-state gatherers, static methods of the wrapper class: collectives too.
for _op in ("optim_state_dict", "full_optim_state_dict", "sharded_optim_state_dict"):
    CONCEPTS["FSDP." + _op] = tuple(f"{cls}.{_op}" for cls in FSDP1_CLASS)

CONCEPT_OF: dict[str, str] = {path: concept for concept, paths in CONCEPTS.items() for path in paths}

# Packages that are another name for one we know: ringtrain's Horovod face is Horovod's API.
PREFIXES = {"ringtrain.horovod": "horovod.torch"}

CUSTOMARY = {
    "torch": "torch",
    "nn": "torch.nn",
    "dist": "torch.distributed",
    "mp": "torch.multiprocessing",
    "hvd": "horovod.torch",
    "DistributedDataParallel": "torch.nn.parallel.DistributedDataParallel",
    "DistributedSampler": "torch.utils.data.distributed.DistributedSampler",
    "DataLoader": "torch.utils.data.DataLoader",
    "fully_shard": "torch.distributed.fsdp.fully_shard",
    "FullyShardedDataParallel": "torch.distributed.fsdp.FullyShardedDataParallel",
    "FSDP": "torch.distributed.fsdp.FullyShardedDataParallel",
}


def canonical(path: str) -> str:
    for old, new in PREFIXES.items():
        if path == old or path.startswith(old + "."):
            return new + path[len(old):]
    return path


class Names:
    """Dotted import paths for the names a module binds by import or plain alias."""

    def __init__(self, tree: ast.Module, nodes: list[ast.AST] | None = None):
        self.bound: dict[str, str] = {}
        self.star: list[str] = []
        self.assigned: set[str] = set()  # names bound some other way: never read as CUSTOMARY
        aliases: list[tuple[str, ast.expr]] = []
        for node in nodes if nodes is not None else ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.bound[alias.asname] = alias.name
                    else:  # `import torch.distributed` binds `torch`
                        top = alias.name.split(".")[0]
                        self.bound[top] = top
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    if alias.name == "*":
                        self.star.append(node.module)
                    else:
                        self.bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.ImportFrom):  # `from .fsdp import FSDP`: this package's own FSDP
                self.assigned.update(alias.asname or alias.name for alias in node.names)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                self.assigned.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.assigned.add(node.name)
            elif isinstance(node, ast.arg):
                self.assigned.add(node.arg)
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name)
                    and isinstance(node.value, (ast.Name, ast.Attribute))):
                aliases.append((node.targets[0].id, node.value))
        # `DDP = nn.parallel.DistributedDataParallel`: an alias when the right side is an
        # import path. Two passes resolve an alias of an alias.
        for _ in range(2):
            for name, value in aliases:
                path = self.path(value)
                if path is not None and name not in self.bound:
                    self.bound[name] = path

    def path(self, expr: ast.AST) -> str | None:
        """``torch.nn.parallel.DistributedDataParallel`` for ``nn.parallel.DistributedDataParallel``."""
        if isinstance(expr, ast.Name):
            if expr.id in self.bound:
                return canonical(self.bound[expr.id])
            for module in self.star:
                candidate = canonical(f"{module}.{expr.id}")
                if candidate in CONCEPT_OF:
                    return candidate
            if expr.id in CUSTOMARY and expr.id not in self.assigned:
                return CUSTOMARY[expr.id]
            return None
        if isinstance(expr, ast.Attribute):
            base = self.path(expr.value)
            return None if base is None else f"{base}.{expr.attr}"
        return None

    def concept(self, call: ast.AST) -> str | None:
        """The concept a call (or a callee expression) stands for, e.g. ``"DDP"``, or None."""
        func = call.func if isinstance(call, ast.Call) else call
        path = self.path(func)
        return None if path is None else CONCEPT_OF.get(path)

    def is_horovod(self, expr: ast.AST) -> bool:
        path = self.path(expr)
        return path is not None and (path == "horovod.torch" or path.startswith("horovod.torch."))
