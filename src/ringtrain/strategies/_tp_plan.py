"""Tensor parallelism's plan: which module is cut how — torch's ``parallelize_module`` plan (module name or pattern ->
``ParallelStyle``), inferred from a model's shapes or given, checked, applied on the ``tp`` sub-mesh, and shown.

The inferred plan is torchtitan's (its Llama 3 ``parallelize`` module, ``apply_tp``; Megatron-LM's layout, Shoeybi et al.
2019), found in any model of the usual shapes rather than written per model:

* **attention** — a module with Linear children named as q, k, v (``q``/``q_proj``/``wq``/``query``...) and an output
  projection (``o_proj``/``out_proj``/``proj``/``wo``...): q, k, v column-wise (each rank computes n_heads/N whole
  heads), the output row-wise (its partial sums all-reduced). The module's head counts (``n_heads``, ``num_heads``,
  ``n_kv_heads``...) must divide by N and are set to this rank's share: the attention's own forward then runs
  unchanged on its heads, as long as it sizes its views from them or with -1 (torchtitan's and Hugging Face's
  ``view(B, T, -1, head_dim)``), not from the model width — a forward that does is stopped at its first shape error,
  named. ``nn.MultiheadAttention`` and a fused q/k/v Linear (``qkv``, ``c_attn``) cannot be cut column-wise (a column
  shard would mix q, k and v) and are refused, named;
* **MLP** — a module whose Linear children chain up and down (``fc1`` C->H then ``fc2`` H->C; SwiGLU's ``w1``/``w3``
  C->H and ``w2`` H->C), or consecutive Linears of an ``nn.Sequential`` with only parameterless modules between them:
  the up projections column-wise, the down one row-wise — the hidden activations stay on their rank;
* **embeddings** row-wise (each rank holds a slice of the vocabulary; the lookups are all-reduced), and the **output
  head** (the last Linear after the blocks) column-wise, its logits gathered whole: the user's loss runs unchanged;
* with ``sequence_parallel=True`` (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models") the residual stream between the blocks is cut along the sequence (dim 1): the blocks' norms and dropouts
  on ``SequenceParallel``, attention and MLP gather the sequence at their input and reduce-scatter it at their output,
  the first block takes its slice of the embeddings' output, the head gathers it back.

A given plan is torch's own (``{"blocks.*.mlp.fc1": ColwiseParallel(), ...}``), checked first: every key must name
a module (torch only warns and skips). Either way ``_tp_apply.apply`` applies it, and ``table`` shows what it did.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..errors import RingtrainError
from ._tp_apply import FirstInput, Plan, Style, cannot, inside, matching

HEAD_ATTRS = ("n_heads", "num_heads", "n_head", "nhead", "num_attention_heads", "heads", "n_kv_heads", "num_kv_heads",
              "n_kv_head", "num_key_value_heads", "n_local_heads", "n_local_kv_heads")
Q_NAMES = {"q", "q_proj", "wq", "query", "to_q", "q_lin", "linear_q", "query_proj", "q_linear"}
K_NAMES = {"k", "k_proj", "wk", "key", "to_k", "k_lin", "linear_k", "key_proj", "k_linear"}
V_NAMES = {"v", "v_proj", "wv", "value", "to_v", "v_lin", "linear_v", "value_proj", "v_linear"}
O_NAMES = ("o_proj", "out_proj", "wo", "o", "proj", "c_proj", "out", "dense", "out_lin", "linear_out", "output",
           "o_linear", "out_linear")
FUSED_NAMES = {"qkv", "c_attn", "wqkv", "in_proj", "qkv_proj", "query_key_value", "to_qkv", "qkv_linear"}
_CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)


def _linears(module: nn.Module) -> list[tuple[str, nn.Linear]]:
    return [(n, c) for n, c in module.named_children() if isinstance(c, nn.Linear)]


def _holds_parameters(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def _is_norm(module: nn.Module) -> bool:
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
        return True
    kind = type(module).__name__
    excluded = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.modules.instancenorm._InstanceNorm)
    return (kind.endswith("Norm") and not isinstance(module, excluded)
            and all(p.dim() == 1 for p in module.parameters(recurse=False)))


def _attention(name: str, module: nn.Module, tp: int) -> dict[str, Any] | None:
    """q, k, v and the output projection of an attention module (and its head counts), or None: not one."""
    fix = "give rt.strategies.TP(..., plan={...}) a plan for it (torch's parallelize_module plan), or write its q, k, v as three nn.Linear"
    if isinstance(module, nn.MultiheadAttention):
        raise cannot(name, "nn.MultiheadAttention keeps q, k and v in one in_proj_weight and computes them in one "
                     "call, which a column shard would mix", fix + " (e.g. q_proj, k_proj, v_proj and out_proj).")
    linears = dict(_linears(module))
    pick = lambda names: [n for n in linears if n.lower() in names]  # noqa: E731
    q, k, v = pick(Q_NAMES), pick(K_NAMES), pick(V_NAMES)
    fused = pick(FUSED_NAMES)
    heads = {a: getattr(module, a) for a in HEAD_ATTRS
             if isinstance(getattr(module, a, None), int) and not isinstance(getattr(module, a), bool)}
    if not (len(q) == len(k) == len(v) == 1):
        if fused:
            raise cannot(name, f"its q, k and v are one Linear ({fused[0]!r}): a column shard of it would hold all of "
                         "q and part of k on one rank", fix + ".")
        if heads and len(linears) >= 3:  # an attention by its head count, with projections of other names
            raise cannot(name, f"it has {next(iter(heads))}={next(iter(heads.values()))} and Linears "
                         f"{', '.join(linears)}, but none named as q, k and v ({'/'.join(sorted(Q_NAMES)[:4])}...)",
                         fix + ".")
        return None
    outs = [n for n in O_NAMES if n in linears and n not in (q[0], k[0], v[0])
            and linears[n].in_features == linears[q[0]].out_features]
    if not outs:
        raise cannot(name, f"it has q, k, v ({q[0]}, {k[0]}, {v[0]}) but no output projection named "
                     f"{'/'.join(O_NAMES[:6])}... taking {linears[q[0]].out_features} features", fix + ".")
    for attr, count in heads.items():
        if count % tp:
            raise cannot(name, f"its {attr}={count} does not divide over tp={tp} (each rank computes whole heads)",
                         f"choose tp among the divisors of {count}, or change the model's head count.")
    for part in (q[0], k[0], v[0]):
        if linears[part].out_features % tp:
            raise cannot(f"{name}.{part}" if name else part, f"its {linears[part].out_features} output features do "
                         f"not divide over tp={tp}", f"choose tp among the divisors of {linears[part].out_features}.")
    return {"q": q[0], "k": k[0], "v": v[0], "o": outs[0], "heads": heads}


def _mlp_pairs(module: nn.Module) -> list[tuple[list[str], str]]:
    """(up projections, down projection) groups among ``module``'s Linear children."""
    linears = _linears(module)
    if len(linears) < 2:
        return []
    others = [c for _, c in module.named_children() if not isinstance(c, nn.Linear)]
    if not any(_holds_parameters(c) for c in others):
        downs = [d for d, dl in linears if all(ul.out_features == dl.in_features and ul.in_features == dl.out_features
                                               for u, ul in linears if u != d)]
        if downs:
            down = downs[-1]  # square Linears (C->C, C->C) both fit: the one registered last goes down
            return [([u for u, _ in linears if u != down], down)]
    if not isinstance(module, nn.Sequential):
        return []
    pairs, children, i = [], list(module.named_children()), 0
    while i < len(children):
        name, child = children[i]
        if isinstance(child, nn.Linear):
            j = i + 1
            while j < len(children) and not isinstance(children[j][1], nn.Linear) and \
                    not _holds_parameters(children[j][1]):
                j += 1
            if j < len(children) and isinstance(children[j][1], nn.Linear) and \
                    children[j][1].in_features == child.out_features:
                pairs.append(([name], children[j][0]))
                i = j + 1
                continue
        i += 1
    return pairs


def infer(model: nn.Module, tp: int, sequence_parallel: bool) -> Plan:
    """The plan for ``model``'s shapes over ``tp`` ranks (module docstring); refuses what it cannot cut, naming it."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    modules = dict(model.named_modules())
    plan = Plan(styles={}, inferred=True)
    sp = Shard(1) if sequence_parallel else Replicate()
    attention: dict[str, dict[str, Any]] = {}
    for name, module in modules.items():
        if any(inside(name, a) for a in attention):
            continue
        found = _attention(name, module, tp)
        if found is not None:
            attention[name] = found
    claimed = [*attention]
    mlps: dict[str, list[tuple[list[str], str]]] = {}
    for name, module in modules.items():
        if any(inside(name, c) for c in claimed):
            continue
        pairs = _mlp_pairs(module)
        if pairs:
            mlps[name] = pairs
            claimed.append(name)
    plan.attention = list(attention)
    holders = [n for n in modules if any(inside(a, n) for a in attention)]
    # the innermost container of every attention: a Sequential model's (a pipeline stage's) blocks, not itself
    trunk = next((n for n in reversed(holders) if isinstance(modules[n], _CONTAINERS)
                  and all(inside(a, n) for a in attention)), None)
    plan.trunk = trunk
    blocks = [f"{trunk}.{c}" if trunk else c for c, _ in modules[trunk].named_children()] if trunk is not None else []
    plan.blocks = blocks
    in_blocks = lambda n: any(inside(n, b) for b in blocks)  # noqa: E731
    if sequence_parallel and trunk is None:
        raise RingtrainError(
            "TP(sequence_parallel=True) found no transformer blocks in the model (attention modules in an "
            "nn.ModuleList, nn.Sequential or nn.ModuleDict): sequence parallelism cuts the residual stream between them",
            "drop sequence_parallel=True, or give a plan of your own (plan={...}).")
    for name, found in attention.items():
        prefix = f"{name}." if name else ""
        for part in ("q", "k", "v"):
            plan.styles[prefix + found[part]] = ColwiseParallel()
        plan.styles[prefix + found["o"]] = RowwiseParallel(output_layouts=sp if in_blocks(name) else Replicate())
        plan.heads[name] = found["heads"]
    for name, pairs in mlps.items():
        prefix = f"{name}." if name else ""
        for ups, down in pairs:
            hidden = modules[prefix + down].in_features
            if hidden % tp:
                raise cannot(name, f"its hidden width {hidden} ({', '.join(ups)} -> {down}) does not divide over "
                             f"tp={tp}", f"choose tp among the divisors of {hidden}.")
            for up in ups:
                plan.styles[prefix + up] = ColwiseParallel()
            plan.styles[prefix + down] = RowwiseParallel(output_layouts=sp if in_blocks(name) else Replicate())
    after = False
    head = None
    for name, module in modules.items():
        if trunk is not None and name == trunk:
            after = True
        if any(inside(name, c) for c in claimed) or in_blocks(name):
            continue
        if isinstance(module, nn.Embedding) and module.max_norm is None and module.num_embeddings >= tp:
            plan.styles[name] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
        elif after and isinstance(module, nn.Linear):
            head = name
        elif after and sequence_parallel and _is_norm(module):
            plan.styles[name] = SequenceParallel(use_local_output=True)
    if head is not None:
        plan.styles[head] = ColwiseParallel(input_layouts=sp, output_layouts=Replicate())
    if sequence_parallel:
        plan.styles[blocks[0]] = FirstInput(Replicate(), Shard(1), tp)
        for name, module in modules.items():
            if not in_blocks(name) or any(inside(name, c) for c in claimed):
                continue
            if _is_norm(module) or isinstance(module, nn.Dropout):
                plan.styles[name] = SequenceParallel(use_local_output=True)
        for name in [*attention, *mlps]:
            if in_blocks(name) and name not in blocks:
                plan.styles[name] = FirstInput(Shard(1), Replicate(), tp)
    return plan


def given(model: nn.Module, styles: dict[str, Any]) -> Plan:
    """The user's plan, checked: a ParallelStyle for each key, and each key (a name or a pattern, as
    parallelize_module reads it: fnmatch per dotted part) naming at least one module (torch only warns)."""
    from torch.distributed.tensor.parallel import ParallelStyle

    if not isinstance(styles, dict) or not styles:
        raise RingtrainError(f"TP got plan={styles!r}", "give a dict of module names (or patterns, e.g. "
                             "'blocks.*.attn.q') to torch ParallelStyles, e.g. {'fc1': ColwiseParallel(), 'fc2': "
                             "RowwiseParallel()}, or plan=None for the inferred plan.")
    names = [n for n, _ in model.named_modules() if n]
    for key, style in styles.items():
        if not isinstance(style, ParallelStyle):
            raise RingtrainError(f"TP's plan maps {key!r} to {style!r}, which is not a ParallelStyle",
                                 "use torch.distributed.tensor.parallel's ColwiseParallel(), RowwiseParallel(), "
                                 "SequenceParallel(), PrepareModuleInput(...), or a ParallelStyle of your own.")
        if key and not matching(names, key):
            parent = key.rsplit(".", 1)[0] + ".*" if "." in key else "*"
            near = [n for n in names if n.split(".")[-1] == key.split(".")[-1]][:4] or matching(names, parent)[:4]
            raise RingtrainError(f"TP's plan names {key!r}, and no module of {type(model).__name__} matches it",
                                 "use the names model.named_modules() gives" + (f" (e.g. {near})" if near else "") +
                                 "; a pattern matches each dotted part with fnmatch ('blocks.*.mlp.fc1').")
    return Plan(styles=dict(styles), inferred=False)


def table(model: nn.Module, plan: Plan, tp: int, sequence_parallel: bool) -> str:
    """What ``apply`` did, one row per module in the model's order (the blocks' rows once, as ``blocks.*``, where
    every block has them): the lines the main process prints."""
    names = [n for n, _ in model.named_modules()]
    what: dict[str, list[str]] = {}
    for key, style in plan.styles.items():
        found = matching(names, key) if key else [""]
        if plan.inferred:
            for name in found:
                what.setdefault(name, []).append(describe(style))
        else:
            what.setdefault(key, []).append(describe(style) + (f" ({len(found)} modules)" if len(found) > 1 else ""))
    for name in plan.replicated:
        what.setdefault(name, []).append("replicated (computed on every rank)")
    for name, heads in plan.heads.items():
        if heads:
            what.setdefault(name, []).append(", ".join(f"{a} {c} -> {c // tp} per rank" for a, c in heads.items()))
    rows = sorted(what.items(), key=lambda row: names.index(row[0]) if row[0] in names else -1)
    if len(plan.blocks) > 1:
        grouped: dict[tuple[str, tuple[str, ...]], list[str]] = {}
        for name, descriptions in rows:
            block = next((b for b in plan.blocks if inside(name, b)), None)
            key = name if block is None else (f"{plan.trunk}.*" if plan.trunk else "*") + name[len(block):]
            grouped.setdefault((key, tuple(descriptions)), []).append(name)
        rows = []
        for (key, descriptions), members in grouped.items():
            shown = [key] if len(members) == len(plan.blocks) else members
            rows += [(name, list(descriptions)) for name in shown]
    width = max([len(n or "(the model)") for n, _ in rows] + [6])
    mode = ", sequence parallel" if sequence_parallel else ""
    lines = [f"ringtrain: tensor parallel over {tp} ranks{mode}, {'inferred' if plan.inferred else 'your'} plan:",
             f"  {'module'.ljust(width)}  style"]
    lines += [f"  {(name or '(the model)').ljust(width)}  {'; '.join(descriptions)}" for name, descriptions in rows]
    return "\n".join(lines)


def describe(style: Any) -> str:
    """A style in a few words: the class, and the layouts where they are not its defaults."""
    from torch.distributed.tensor import Replicate, Shard

    if isinstance(style, Style):
        return repr(style)
    kind = type(style).__name__
    defaults = {"ColwiseParallel": (Replicate(), Shard(-1)), "RowwiseParallel": (Shard(-1), Replicate())}
    if kind in defaults and hasattr(style, "input_layouts"):
        given = (style.input_layouts[0], style.output_layouts[0])
        shown = [f"{w} {v}" for w, v, d in zip(("input", "output"), given, defaults[kind]) if v != d]
        return f"{kind}({', '.join(shown)})" if shown else kind
    if kind == "SequenceParallel":
        return kind
    text = repr(style)
    return text if len(text) <= 60 else text[:57] + "..."
