"""Rules about DataLoader and DistributedSampler."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from ..nodes import callee_name, dotted, is_const, is_evalish, keyword
from ..script import Script
from .loaders import epoch_loops, iteration_loops, loaders, sampler_arg

REDUCTIONS = {"all_reduce", "allreduce", "allreduce_", "reduce", "all_gather", "allgather", "all_gather_object",
              "allgather_object", "all_gather_into_tensor", "gather", "gather_object", "gather_for_metrics",
              "reduce_scatter", "reduce_scatter_tensor", "grouped_allreduce"}


def _name(expr: ast.AST | None, fallback: str) -> str:
    text = dotted(expr) if expr is not None else None
    return f"`{text}`" if text else fallback


def _shuffles(script: Script, sampler: ast.Call) -> bool:
    shuffle = sampler_arg(script, sampler, "shuffle")
    return shuffle is None or not is_const(shuffle, False)


def _reseeded_in(script: Script, sampler: ast.Call, epoch: ast.AST) -> bool:
    """``DistributedSampler(ds, seed=epoch)`` built inside the epoch loop: a new order each epoch."""
    seed = sampler_arg(script, sampler, "seed")
    return seed is not None and not isinstance(seed, ast.Constant) and script.inside(sampler, epoch)


def _trains(script: Script, loop: ast.AST) -> bool:
    return any(callee_name(c) == "backward" for c in script.calls_in(loop, depth=2))


def sampler_set_epoch(script: Script) -> Iterator[tuple]:
    reported: set[int] = set()
    for loader in loaders(script):
        if not loader.samplers or not any(_shuffles(script, s) for s in loader.samplers):
            continue
        evaluation = any(is_evalish(t) for t in loader.names())
        keys = {script.scope_of(b) for b in loader.bindings}
        for loop in iteration_loops(script, loader.bindings):
            if evaluation and not _trains(script, loop):
                continue  # the order of evaluation batches does not matter
            for epoch in epoch_loops(script, loop, keys):
                if id(epoch) in reported:
                    continue
                if any(callee_name(c) == "set_epoch" for c in script.calls_in(epoch, depth=2)):
                    continue
                if any(_reseeded_in(script, s, epoch) for s in loader.samplers):
                    continue
                reported.add(id(epoch))
                sampler = dotted(loader.sampler) if loader.sampler is not None else None
                call = f"{sampler}.set_epoch(epoch)" if sampler else "sampler.set_epoch(epoch)"
                loader_name = _name(loader.bindings[0] if loader.bindings else None, "the loader")
                yield (epoch,
                       f"{loader_name} draws from a DistributedSampler{f' (`{sampler}`)' if sampler else ''}, which "
                       f"shuffles with seed + epoch, but this epoch loop never calls {call}: every epoch visits "
                       "the samples in the same order",
                       f"call {call} at the top of the epoch loop, before iterating the loader; in ringtrain, "
                       "loaders from ring.loader(..., shuffle=True) iterated under `for epoch in ring.epochs(n)` "
                       "get it automatically")


def shuffle_with_sampler(script: Script) -> Iterator[tuple]:
    for call in script.concept_calls.get("DataLoader", []):
        shuffle = keyword(call, "shuffle", 2)
        if not is_const(shuffle, True):
            continue
        for field, position in (("sampler", 3), ("batch_sampler", 4)):
            given = keyword(call, field, position)
            if given is None or is_const(given, None):
                continue
            origins = script.origins(given)
            sometimes = any(is_const(o, None) for o in origins)
            if all(is_const(o, None) for o in origins):
                continue
            when = " whenever the sampler is set" if sometimes else ""
            yield (call,
                   f"DataLoader(shuffle=True, {field}={script.text(given)}) raises ValueError "
                   f"(\"{field} option is mutually exclusive with shuffle\"){when}",
                   f"the sampler does the shuffling: drop shuffle=True (or write shuffle=({script.text(given)} is None)); "
                   "ringtrain's ring.loader(dataset, shuffle=True) builds the sharded, shuffling sampler itself")
            break


def _drops_last(script: Script, sampler: ast.Call) -> bool:
    drop_last = sampler_arg(script, sampler, "drop_last")
    if is_const(drop_last, True):
        return True
    # MONAI's DistributedSampler(even_divisible=False) gives ranks uneven shares instead of padding.
    return is_const(keyword(sampler, "even_divisible"), False) or (
        drop_last is not None and not isinstance(drop_last, ast.Constant))


def _reduces_near(script: Script, loop: ast.AST) -> bool:
    """A reduction in the function that iterates the loader, in what it calls, or in its callers."""
    fn = script.function_of(loop)
    scopes = [fn] + [script.function_of(c) for c in script.callers(fn)]
    return any(callee_name(c) in REDUCTIONS for scope in scopes for c in script.calls_in(scope, depth=2))


def eval_sampler_padding(script: Script) -> Iterator[tuple]:
    reported: set[int] = set()
    for loader in loaders(script):
        if not any(is_evalish(t) for t in loader.names()):
            continue
        for sampler in loader.samplers:
            if id(sampler) in reported or _drops_last(script, sampler):
                continue
            if not any(_reduces_near(script, loop) for loop in iteration_loops(script, loader.bindings)):
                continue
            reported.add(id(sampler))
            dataset = _name(sampler_arg(script, sampler, "dataset"), "the evaluation set")
            yield (sampler,
                   f"possible: DistributedSampler pads {dataset} with repeated samples up to a multiple of the "
                   "number of processes (drop_last=False), and the metric reduced across ranks counts those "
                   f"duplicates whenever len({dataset.strip('`')}) is not a multiple of the world size",
                   "evaluate each sample exactly once: in ringtrain, ring.loader(eval_set, batch_size=..., exact=True) "
                   "and sum counts with ring.all_reduce(x, op='sum'); in plain torch, shard without padding "
                   "(torch.utils.data.Subset(eval_set, range(rank, len(eval_set), world_size))) and all_reduce the "
                   "summed counts, not per-rank averages")


def _floor_division(expr: str) -> str:
    """``128 // size`` for ``128 / float(size)``: ``//`` of a float is a float too."""
    return re.sub(r"\bfloat\(([^()]*)\)", r"\1", expr).replace(" / ", " // ")


def batch_size_float(script: Script) -> Iterator[tuple]:
    for call in script.concept_calls.get("DataLoader", []):
        size = keyword(call, "batch_size", 1)
        if size is None:
            continue
        origins = script.origins(size)
        if origins and all(isinstance(o, ast.BinOp) and isinstance(o.op, ast.Div) for o in origins):
            expr = script.text(origins[0])
            given = "" if origins[0] is size else f"={script.text(size)}"
            yield (call,
                   f"batch_size{given} is `{expr}`, a float ('/' always gives one in Python 3): DataLoader raises "
                   "ValueError (\"batch_size should be a positive integer value\")",
                   f"use integer division of integers ({_floor_division(expr)}); in ringtrain, batch_size is per "
                   "device in every strategy and ring.loader takes it as given")


def sampler_dataset_mismatch(script: Script) -> Iterator[tuple]:
    for loader in loaders(script):
        read = loader.dataset
        if not isinstance(read, (ast.Name, ast.Attribute)):
            continue
        for sampler in loader.samplers:
            sharded = sampler_arg(script, sampler, "dataset")
            if not isinstance(sharded, (ast.Name, ast.Attribute)) or script.same_value(read, sharded):
                continue
            yield (loader.call,
                   f"this DataLoader reads `{dotted(read)}` but its DistributedSampler shards `{dotted(sharded)}`: "
                   f"the indices come from the other dataset's length, so it reads the wrong samples (or fails "
                   "with an IndexError)",
                   f"build the sampler on the dataset the loader reads: DistributedSampler({dotted(read)}); "
                   "ring.loader(dataset, ...) makes the sampler from the dataset it is given")
            break
