"""Rules about sharded training (FSDP): the optimizer built before sharding, the state taken on
one rank, the shards saved by every rank to one file, and FSDP1 where FSDP2 serves.

save-sharded-every-rank and save-every-rank look at the same torch.save calls; on one that writes
a state that differs per rank (shards, or a state gathered to rank 0 only) the error here is
the finding, and save-every-rank (a warning, for replicated state) stays quiet.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..names import FSDP1_CLASS
from ..nodes import callee_name, dotted, is_const, keyword, position
from ..ranks import mentions_a_rank, per_rank_path, rank_guard, singles_out_one_rank
from ..script import Script
from .shards import Sharding, related

# FSDP1's wrapper, its configuration classes and wrap policies: FSDP2 has its own or needs none.
_FSDP1_NAMES = FSDP1_CLASS + tuple("torch.distributed.fsdp." + n for n in (
    "ShardingStrategy", "StateDictType", "StateDictConfig", "FullStateDictConfig", "ShardedStateDictConfig",
    "LocalStateDictConfig", "OptimStateDictConfig", "FullOptimStateDictConfig", "ShardedOptimStateDictConfig",
    "LocalOptimStateDictConfig", "StateDictSettings", "BackwardPrefetch", "CPUOffload", "MixedPrecision",
    "OptimStateKeyType", "wrap", "fully_sharded_data_parallel", "api"))
# What an FSDP1 script uses -> what does it in FSDP2 (for the fsdp1-api hint).
_FSDP2_FOR = {
    "auto_wrap_policy": "fully_shard(block) for each block, then fully_shard(model)",
    "sharding_strategy": "reshard_after_forward=True (FULL_SHARD) or False (SHARD_GRAD_OP), a 2-D mesh "
                         "for HYBRID_SHARD",
    "mixed_precision": "mp_policy=MixedPrecisionPolicy(param_dtype=..., reduce_dtype=...)",
    "cpu_offload": "offload_policy=CPUOffloadPolicy()",
    "state_dict_type": "get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, "
                       "cpu_offload=True)) or dcp.save",
}
# Parts of FSDP1 names -> the _FSDP2_FOR entry that replaces them.
_FEATURE = {"ShardingStrategy": "sharding_strategy", "StateDict": "state_dict_type", "state_dict_type":
            "state_dict_type", "CPUOffload": "cpu_offload", "MixedPrecision": "mixed_precision",
            "fsdp.wrap": "auto_wrap_policy"}

_STATE_HINT = ("take the state on every rank and write it on one: sd = get_model_state_dict(model, options="
               "StateDictOptions(full_state_dict=True, cpu_offload=True)) (torch.distributed.checkpoint.state_dict; "
               "get_optimizer_state_dict for the optimizer), then `if rank == 0: torch.save(sd, path)`; or "
               "dcp.save(...) on every rank; in ringtrain, ring.save(path, model=model, optimizer=optimizer) "
               "(a sharded folder) or ring.save(path, ..., full=True)")


def optimizer_before_shard(script: Script) -> Iterator[tuple]:
    sharding = Sharding(script)
    # FSDP1 with use_orig_params=True keeps the parameter objects (as views into its FlatParameter)
    shards = [s for s in sharding.shards if not (s.fsdp1 and keyword(s.call, "use_orig_params") is not None
                                                 and not is_const(keyword(s.call, "use_orig_params"), False))]
    for opt, owners in sharding.optimizers:
        for shard in shards:
            if not related(owners, shard.keys) or (site := sharding.first(opt, shard.call)) is None:
                continue
            if any(o is not opt and sharding.stored_in(o) & sharding.stored_in(opt) and sharding.first(shard.call, o)
                   for o, _ in sharding.optimizers):
                continue  # built again after sharding, into the same name: the early one is dropped
            how = ("FullyShardedDataParallel", "flattens them into sharded FlatParameters (use_orig_params=False)") \
                if shard.fsdp1 else ("fully_shard", "replaces them with sharded DTensor parameters")
            yield (site,
                   f"the optimizer is built on the model's parameters before {how[0]} (line {shard.call.lineno}) "
                   f"{how[1]}: it holds the old tensors, which the model no longer uses — their gradients stay "
                   "None, and optimizer.step() quietly trains nothing",
                   "build the optimizer after sharding: fully_shard each block, then the model, then "
                   "optimizer = torch.optim.AdamW(model.parameters(), ...); in ringtrain, "
                   "rt.Ring(strategy=rt.strategies.FSDP()) and ring.setup(model, optimizer) shard the model and "
                   "rebuild the optimizer on the shards")
            break


def rank_check_line(script: Script, call: ast.Call) -> int:
    """The line of the rank-0 check that keeps ``call`` off the other ranks; 0 when every rank runs
    it, or when the ``else`` of that check runs its twin there."""
    guarded, lines = rank_guard(script, call)
    if guarded is not True:
        return 0
    for branch, in_body in script.branches_around(call):
        if isinstance(branch, ast.If) and singles_out_one_rank(branch.test):
            twin = branch.orelse if in_body else branch.body
            if any(callee_name(c) == callee_name(call) for s in twin for c in script.calls_in(s, 1)):
                return 0
    fn = script.function_of(call)
    return lines[0] if lines else next((d.lineno for d in getattr(fn, "decorator_list", [])), fn.lineno)


def sharded_state_on_one_rank(script: Script) -> Iterator[tuple]:
    sharding = Sharding(script)
    if not sharding.shards:
        return
    saved: set[int] | None = None
    for call in script.calls:
        if (kind := sharding.state(call)) is None:
            continue
        if not kind[1]:
            if saved is None:
                saved = {id(c) for s in script.concept_calls.get("save", [])
                         for c in sharding.saved_states(keyword(s, "obj", 0))}
            if id(call) not in saved:
                continue  # rank 0 looking at its own shards (a print, a norm) is harmless
        if not (line := rank_check_line(script, call)):
            continue
        what = dotted(call.func) or callee_name(call)
        if kind[1]:
            message = (f"{what}() gathers the sharded state, a collective every rank must join, but only the "
                       f"process picked by the rank check at line {line} calls it: the other ranks never join, "
                       "and the job hangs until the timeout")
        else:
            message = (f"{what}() gives this rank's shards of a sharded model's state (DTensors), and only the "
                       f"process picked by the rank check at line {line} saves it: the checkpoint holds 1/world "
                       "of the state (and a .full_tensor() on it would hang)")
        yield call, message, _STATE_HINT


def writes_shards(script: Script, save: ast.Call) -> str | None:
    """Does a torch.save write a state that differs per rank ("shards", "rank0"; see
    :meth:`Sharding.writes`)? For save-every-rank, which leaves those calls to this module."""
    return Sharding(script).writes(save) if script.has_concept("fully_shard", "FSDP") else None


def save_sharded_every_rank(script: Script) -> Iterator[tuple]:
    sharding = Sharding(script)
    if not sharding.shards:
        return
    for save in script.concept_calls.get("save", []):
        path = keyword(save, "f", 1)
        if path is not None and per_rank_path(script.built_from(path)):
            continue
        if script.guarded(save, mentions_a_rank) is not False or not (kind := sharding.writes(save)):
            continue
        if kind == "shards":
            message = ("torch.save of a sharded model's state (DTensor shards) on every rank, to one path: each "
                       "rank overwrites the file with its own shard, so it ends up holding one rank's 1/world of "
                       "the model, and loading it gives DTensors a plain model cannot take")
        else:
            message = ("torch.save on every rank, to one path, of a state gathered with full_state_dict=True and "
                       "cpu_offload=True: only rank 0 holds it, the other ranks hold an empty dict and write it "
                       "over the same file — the checkpoint may be empty")
        yield (save, message,
               "let each rank write its own shard into one folder with dcp.save(state_dict, checkpoint_id=folder) "
               "(torch.distributed.checkpoint), or gather a full state on every rank and save it on rank 0 only; "
               "in ringtrain, ring.save(path, model=model, optimizer=optimizer)")


def fsdp1_api(script: Script) -> Iterator[tuple]:
    wraps = sorted(script.concept_calls.get("FSDP", []), key=position)
    if not wraps and "fsdp" not in script.source.lower():
        return  # every FSDP1 name comes in through an import that says fsdp
    uses = [(n, path) for n in script.nodes if isinstance(n, (ast.Name, ast.Attribute))
            and (path := script.names.path(n)) and any(path == p or path.startswith(p + ".") for p in _FSDP1_NAMES)]
    if not wraps and not uses:
        return
    used = {kw.arg for w in wraps for kw in w.keywords}
    used |= {feature for _, path in uses for text, feature in _FEATURE.items() if text in path}
    steps = "; ".join(f"{k} -> {v}" for k, v in _FSDP2_FOR.items() if k in used or k == "auto_wrap_policy")
    yield (wraps[0] if wraps else min((n for n, _ in uses), key=position),
           "this script uses FSDP1 (FullyShardedDataParallel, its wrap policies and configs): torch's docs "
           "recommend FSDP2, torch.distributed.fsdp.fully_shard, and give a migration guide — per-parameter "
           "DTensor shards instead of flat parameters, simpler state dicts (a sharded one needs no "
           "communication), torch.compile support",
           f"shard with fully_shard instead ({steps}); in ringtrain, rt.Ring(strategy=\"fsdp\") or "
           "rt.strategies.FSDP(wrap=..., reshard_after_forward=..., offload=\"cpu\", replicate=k)")
