"""Random draws the ranks must agree on: a split or a permutation that decides which samples
each rank's dataset holds (``random_split``, ``torch.randperm``, ``np.random.permutation``,
``random.shuffle``). Every process draws from its own generator; unless the script seeds it
alike on every rank (or passes a seeded generator), each rank gets a different split."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ..nodes import identifiers, keyword
from ..ranks import RANKISH, SEEDERS, TORCH_SEEDERS, seeded_alike, singles_out_one_rank
from ..script import Script

# Which seeding calls make each kind of draw the same on every rank.
_SEEDED_BY = {"random_split": TORCH_SEEDERS, "randperm": TORCH_SEEDERS, "np.permutation": SEEDERS,
              "random.shuffle": SEEDERS}


def _mentions_rank(expr: ast.AST) -> bool:
    return any(RANKISH.search(n.lower()) for n in identifiers(expr))


def _generator_seeds(script: Script, generator: ast.AST) -> str | None:
    """How a ``generator=`` argument is seeded: "alike", "per-rank" (``manual_seed(rank)``), or
    None (``torch.Generator()`` never seeded: each process seeds it from its own entropy)."""
    origins = script.origins(generator)
    seeds = []
    for origin in origins:
        node = origin
        while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "manual_seed":
                seeds.append(node)
            node = node.func.value
    if isinstance(generator, (ast.Name, ast.Attribute)):  # gen = torch.Generator(); gen.manual_seed(s)
        named = script.aliases(generator)
        seeds += [c for c in script.calls if isinstance(c.func, ast.Attribute) and c.func.attr == "manual_seed"
                  and script.aliases(c.func.value) & named]
    if any(_mentions_rank(s) for s in seeds):
        return "per-rank"
    if seeds:
        return "alike"
    bare = all(isinstance(o, ast.Call) and (script.names.path(o.func) or "") == "torch.Generator" and not o.args
               for o in origins)
    return None if bare else "alike"  # a generator made elsewhere: assume it is seeded


def _derived(script: Script, start: set, depth: int = 3) -> set:
    """Bindings whose value is computed from ``start``'s (``idx = perm[:n].tolist()``)."""
    keys = set(start)
    for _ in range(depth):
        grown = set(keys)
        for key, entries in script.assignments.items():
            if key in grown:
                continue
            for _, value in entries:
                if value is not None and _uses(script, value, keys):
                    grown.add(key)
                    break
        if grown == keys:
            break
        keys = grown
    return keys


def _uses(script: Script, expr: ast.AST, keys: set) -> bool:
    return any(isinstance(n, (ast.Name, ast.Attribute)) and script.scope_of(n) in keys for n in ast.walk(expr))


def _builds_per_rank_data(script: Script, keys: set) -> ast.AST | None:
    """Where the permuted indices choose samples: ``Subset(ds, idx)``, ``SubsetRandomSampler(idx)``,
    or a slice taken by rank (``perm[rank::world_size]``)."""
    for call in script.concept_calls.get("Subset", []):
        if any(_uses(script, a, keys) for a in (*call.args, *(k.value for k in call.keywords))):
            return call
    for node in script.nodes:
        if isinstance(node, ast.Subscript) and _uses(script, node.value, keys) and _mentions_rank(node.slice):
            return node
    return None


def _permuted(script: Script, call: ast.Call, concept: str) -> set:
    """The bindings a permutation lands in: ``perm = torch.randperm(n)`` (through ``[:k]`` and
    ``.tolist()``), or the list ``random.shuffle(indices)`` shuffles in place."""
    if (script.names.path(call.func) or "").endswith(".shuffle"):
        target = call.args[0] if call.args else None
        return {script.scope_of(target)} - {None} if isinstance(target, (ast.Name, ast.Attribute)) else set()
    node, parent = call, script.parent.get(call)
    while (isinstance(parent, ast.Subscript) and parent.value is node) or (
            isinstance(parent, ast.Attribute) and isinstance(script.parent.get(parent), ast.Call)):
        node = parent if isinstance(parent, ast.Subscript) else script.parent[parent]  # randperm(n)[:k].tolist()
        parent = script.parent.get(node)
    if isinstance(parent, ast.Assign):
        return {script.scope_of(t) for t in parent.targets if isinstance(t, (ast.Name, ast.Attribute))} - {None}
    return set()


def _draws(script: Script) -> Iterator[tuple[ast.Call, str]]:
    for concept in _SEEDED_BY:
        for call in script.concept_calls.get(concept, []):
            yield call, concept


def unseeded_split(script: Script) -> Iterator[tuple]:
    if not script.is_distributed():
        return
    for call, concept in sorted(_draws(script), key=lambda d: (d[0].lineno, d[0].col_offset)):
        if script.guarded(call, singles_out_one_rank):
            continue  # drawn on one rank (and shared, or used there only)
        generator = keyword(call, "generator", 2 if concept == "random_split" else None)
        if concept in ("random_split", "randperm") and generator is not None:
            how = _generator_seeds(script, generator)
            if how == "alike":
                continue
        elif seeded_alike(script, _SEEDED_BY[concept]):
            continue
        else:
            how = None
        name = script.text(call.func)
        if concept != "random_split":
            if _builds_per_rank_data(script, _derived(script, _permuted(script, call, concept))) is None:
                continue  # a permutation that never picks a rank's samples (augmentation, a batch shuffle)
        drawn = ("its generator is seeded with the rank" if how == "per-rank" else
                 "its generator is never seeded" if generator is not None else
                 "the script never seeds the generator alike on every rank")
        yield (call,
               f"{name}(...) draws a different permutation on every rank ({drawn}), and it decides which samples "
               "a dataset holds: each rank splits (or shards) the data differently — one rank trains on samples "
               "another evaluates, a DistributedSampler shards a different set on each rank, and some samples are "
               "never seen",
               "draw it the same on every rank: random_split(dataset, lengths, generator=torch.Generator()."
               "manual_seed(42)) (torch.randperm(n, generator=...) likewise), or torch.manual_seed(seed) with one "
               "seed for all ranks before it; rt.Ring(seed=s) seeds every rank alike up to ring.setup (seed + rank "
               "after it)")
