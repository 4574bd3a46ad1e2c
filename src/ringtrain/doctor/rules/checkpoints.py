"""Rules about torch.save and torch.load in a script that runs as several processes."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..nodes import callee_name, keyword
from ..ranks import mentions_a_rank, per_rank_path, singles_out_one_rank
from ..script import Script
from .loaders import bindings
from .sharding import writes_shards


def _per_rank_path(script: Script, path: ast.AST | None) -> bool:
    """``f"ckpt_rank{rank}.pt"``: each rank writes its own file on purpose."""
    return path is not None and per_rank_path(script.built_from(path))


def save_every_rank(script: Script) -> Iterator[tuple]:
    if not script.is_distributed():
        return
    for call in script.concept_calls.get("save", []):
        if _per_rank_path(script, keyword(call, "f", 1)):
            continue
        if script.guarded(call, mentions_a_rank) is not False:
            continue  # guarded, or in a function this file never calls: nothing to justify a report
        if writes_shards(script, call):
            continue  # a state that differs per rank: save-sharded-every-rank reports it, as an error
        yield (call,
               "torch.save runs on every rank: all processes write the same file at once (a torn or corrupt "
               "checkpoint, and world-size times the I/O)",
               "save on one process: `if dist.get_rank() == 0: torch.save(...)`, then dist.barrier() before "
               "any rank reads it; ringtrain's ring.save(path, model=model, optimizer=optimizer) writes on rank 0, "
               "atomically, and unwraps DDP's `module.` prefix")


def load_map_location(script: Script) -> Iterator[tuple]:
    if not (script.is_distributed() and script.uses_cuda()):
        return
    for call in script.concept_calls.get("load", []):
        if keyword(call, "map_location", 1) is not None or any(kw.arg is None for kw in call.keywords):
            continue
        if _sibling_maps(script, call):
            continue  # `if gpu is None: torch.load(p) else: torch.load(p, map_location=loc)`: a choice
        if script.guarded(call, singles_out_one_rank) is True:
            continue  # one process loads: the device it was saved from is its own
        if not _feeds_a_model(script, call):
            continue  # features, tensors, configs: saved from the CPU as often as not
        yield (call,
               "torch.load without map_location restores every tensor onto the device it was saved from "
               "(cuda:0 for a checkpoint written by rank 0): every rank loads a copy onto GPU 0 — memory "
               "wasted there, or out of memory",
               "torch.load(path, map_location=f'cuda:{local_rank}') (or map_location='cpu', then "
               "load_state_dict); ringtrain's ring.load(path, model=model, ...) maps onto each rank's device")


def _feeds_a_model(script: Script, call: ast.Call) -> bool:
    """Is what ``torch.load`` returns given to ``load_state_dict`` (a checkpoint of a model
    trained on a GPU holds CUDA tensors)? ``m.load_state_dict(torch.load(p))`` or
    ``ckpt = torch.load(p); m.load_state_dict(ckpt["model"])``."""
    keys = {script.scope_of(b) for b in bindings(script, call)} - {None}
    for use in script.calls:
        if callee_name(use) != "load_state_dict":
            continue
        for arg in (*use.args, *(k.value for k in use.keywords)):
            for node in ast.walk(arg):
                if node is call or (isinstance(node, (ast.Name, ast.Attribute)) and script.aliases(node) & keys):
                    return True
    return False


def _sibling_maps(script: Script, call: ast.Call) -> bool:
    for branch, in_body in script.branches_around(call):
        if not isinstance(branch, ast.If):
            continue
        other = branch.orelse if in_body else branch.body
        for stmt in other:
            for sub in ast.walk(stmt):
                if isinstance(sub, ast.Call) and script.names.concept(sub) == "load" \
                        and keyword(sub, "map_location", 1) is not None:
                    return True
    return False
