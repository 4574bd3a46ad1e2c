"""Tensor-parallel jobs run on real Gloo ranks by tests/strategies/test_tp.py (importable by spawned children).

Every case trains the same tiny transformer — a token embedding, 2 blocks of multi-head attention (4 heads; q, k,
v and an output projection, causal SDPA) and an MLP (16 -> 64 -> 16) with pre-norm LayerNorms, a final norm and an
untied head over a vocabulary of 33 (odd: it does not divide over 2 ranks) — with SGD through ``rt.Ring``, on next-
token prediction; ``fit`` returns the whole model (``module_state``), the losses and what the plan did, on rank 0.
"""

from __future__ import annotations

import os
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               SequenceParallel)
from torch.utils.data import TensorDataset

import ringtrain as rt
from ringtrain.strategies import DDP, FSDP, TP, _tp_plan

VOCAB, DIM, HEADS, SEQ, N = 33, 16, 4, 8, 32


class Attention(nn.Module):
    def __init__(self, dim: int = DIM, n_heads: int = HEADS, views: str = "heads"):
        super().__init__()
        self.n_heads, self.head_dim, self.views = n_heads, dim // n_heads, views
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        heads = self.n_heads if self.views == "heads" else -1  # nanoGPT's view, or torchtitan's / HF's -1
        q, k, v = (t.view(B, T, heads, self.head_dim).transpose(1, 2) for t in (self.q(x), self.k(x), self.v(x)))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        width = C if self.views == "width" else -1  # "width": sized from the model's width, which TP cannot run
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, width))


class MLP(nn.Module):
    def __init__(self, dim: int = DIM):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, **attention):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(DIM), Attention(**attention)
        self.ln2, self.mlp = nn.LayerNorm(DIM), MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Tiny(nn.Module):
    def __init__(self, layers: int = 2, tie: bool = False, **attention):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList(Block(**attention) for _ in range(layers))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        if tie:  # GPT-2's: the head is the embedding, transposed
            self.head.weight = self.embed.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def data(n: int = N) -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (n, SEQ + 1), generator=g)
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


def partial_plan() -> dict:
    """A hand-written sequence-parallel plan that forgets the blocks' norms (ln1, ln2): each rank's norm sees only
    its half of the sequence, so its weight's gradient is a partial sum and the copies drift apart."""
    attn = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True)
    return {"embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "blocks.*.attn": attn, "blocks.*.mlp": attn,
            "blocks.*.attn.q": ColwiseParallel(), "blocks.*.attn.k": ColwiseParallel(),
            "blocks.*.attn.v": ColwiseParallel(), "blocks.*.attn.proj": RowwiseParallel(output_layouts=Shard(1)),
            "blocks.*.mlp.fc1": ColwiseParallel(), "blocks.*.mlp.fc2": RowwiseParallel(output_layouts=Shard(1)),
            "norm": SequenceParallel(use_local_output=True),
            "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())}


def full_plan() -> dict:
    """The partial plan with the norms on SequenceParallel: a correct plan of one's own."""
    return {**partial_plan(), "blocks.*.ln1": SequenceParallel(use_local_output=True),
            "blocks.*.ln2": SequenceParallel(use_local_output=True)}


def strategy_of(case: dict):
    tp = case.get("tp")
    if isinstance(tp, dict):
        tp = TP(**{**tp, "plan": {"partial": partial_plan, "full": full_plan}[tp["plan"]]()} if "plan" in tp else tp)
    kind = case.get("strategy", "single")
    if kind == "tp":
        return tp if isinstance(tp, TP) else TP(tp)
    if kind == "ddp":
        return DDP(tp=tp)
    if kind == "fsdp":
        return FSDP(tp=tp, **case.get("fsdp", {}))
    return kind


def fit(case: dict) -> dict | None:
    """Train one case; rank 0 gets {"model", "optimizer", "losses", "steps", "mesh", "table", ...}."""
    ring = rt.Ring(strategy=strategy_of(case), seed=0, accumulate=case.get("accumulate", 1),
                   precision=case.get("precision", "32"))
    torch.manual_seed(0)
    model = Tiny(views=case.get("views", "heads"), tie=case.get("tie", False))
    optimizer = torch.optim.SGD(model.parameters(), lr=case.get("lr", 0.1), momentum=0.9)
    model, optimizer = ring.setup(model, optimizer)
    loader = ring.loader(data(), batch_size=case["batch"], shuffle=True)
    losses, norms, error = [], [], None
    try:
        for _ in ring.epochs(1):
            for x, y in loader:
                loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
                ring.backward(loss)
                if case.get("clip"):
                    norms.append(float(ring.clip_grad_norm_(model, case["clip"])))
                optimizer.step()
                optimizer.zero_grad()
                losses.append(float(ring.all_reduce(loss.detach(), "mean")))
    except rt.RingtrainError as e:
        error = {"message": str(e), "steps": ring.optimizer_steps, "losses": len(losses)}
    applied = getattr(getattr(ring.strategy, "tp", ring.strategy), "applied", None)
    out = {"error": error, "losses": losses, "norms": norms, "steps": ring.optimizer_steps,
           "mesh": ring.mesh.mesh_dim_names if ring.mesh is not None else None,
           "table": _tp_plan.table(ring.unwrap(model), applied[0], 2, case.get("sp", False)) if applied else None,
           "local_numel": sum(_local(p).numel() for p in model.parameters())}
    if error is None:
        out["model"] = ring.strategy.module_state(model)
        out["optimizer"] = ring.strategy.optimizer_state(optimizer, model)
        if case.get("save"):
            ring.save(case["save"], model=model, optimizer=optimizer, epoch=3)
        if case.get("save_full"):
            ring.save(case["save_full"], full=True, model=model, optimizer=optimizer, epoch=3)
    ring.close()
    return out if ring.rank == 0 else None


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if hasattr(p, "to_local") else p


def load_into(path: str, case: dict) -> dict | None:
    """Set up ``case``'s strategy, load ``path`` into a fresh model and optimizer, return the whole state."""
    ring = rt.Ring(strategy=strategy_of(case), seed=5)
    torch.manual_seed(5)  # other weights than the saved ones: the load must replace all of them
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = ring.setup(model, optimizer)
    extra = ring.load(path, model=model, optimizer=optimizer)
    out = {"model": ring.strategy.module_state(model), "optimizer": ring.strategy.optimizer_state(optimizer, model),
           "extra": extra}
    ring.close()
    return out if ring.rank == 0 else None


def sequential(layers: int = 4) -> nn.Sequential:
    """Tiny (seed 0) with ``layers`` blocks as a pipeline cuts it: embed, blocks (a Sequential), norm, head."""
    torch.manual_seed(0)
    tiny = Tiny(layers=layers)
    return nn.Sequential(OrderedDict(embed=tiny.embed, blocks=nn.Sequential(*tiny.blocks), norm=tiny.norm,
                                     head=tiny.head))


def _next_token_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def pipeline_fit(case: dict) -> dict | None:
    """``sequential()`` trained ``case["steps"]`` SGD steps on batches of ``case["batch"]`` (step i: rows i*b ..,
    cut among the replicas), in one process (no "data"), or as ``Pipeline(2, microbatches=2,
    data=strategy_of(case["data"]))`` cut before blocks.2; rank 0 gets {"losses", "model", "mesh", "local_numel",
    "error"}. ``case["drift"]``: the odd ranks' first norm gradient is nudged before the first step (what a plan
    that misses a module does), for the drift guard to name."""
    from ringtrain.strategies import Pipeline

    data_strategy = case.get("data")
    strategy = "single" if data_strategy is None else Pipeline(stages=2, microbatches=2, split_at=["blocks.2"],
                                                               data=strategy_of(data_strategy))
    ring = rt.Ring(strategy=strategy, seed=0, activation_checkpointing=case.get("ac"))
    model = sequential()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = ring.setup(model, optimizer)
    x, y = data().tensors
    losses = []
    per = case["batch"] // ring.strategy.data_parallel_size  # each replica its share of the step's rows
    for step in range(case["steps"]):
        start = step * case["batch"] + ring.strategy.data_parallel_rank * per
        rows = slice(start, start + per)
        if data_strategy is None:
            loss = _next_token_loss(model(x[rows]), y[rows])
            ring.backward(loss)
        else:
            loss = ring.pipeline_step(x[rows], y[rows], _next_token_loss)
        if case.get("drift") and ring.rank % 2:
            next(p for n, p in ring.strategy.named_parameters(model).items() if ".ln1." in n).grad.add_(1.0)
        try:
            optimizer.step()
        except rt.RingtrainError as e:
            ring.close()
            return {"error": str(e)} if ring.rank == 0 else None
        optimizer.zero_grad()
        losses.append(float(ring.all_reduce(loss.detach(), "mean")))  # the replicas' mean: the whole batch's
    out = {"error": None, "losses": losses, "model": ring.strategy.module_state(model),
           "mesh": ring.mesh.mesh_dim_names if ring.mesh is not None else None,
           "local_numel": sum(_local(p).numel() for p in ring.strategy.named_parameters(model).values())}
    ring.close()
    return out if ring.rank == 0 else None


def pipeline_job(cases: dict[str, dict]) -> dict | None:
    out = {name: pipeline_fit(case) for name, case in cases.items()}
    return out if int(os.environ.get("RANK", "0")) == 0 else None


def job(fits: dict[str, dict], loads: list[tuple[str, dict]] = ()) -> dict | None:
    """Several cases and loads in one launch (one spawn: fast on small CPUs)."""
    out = {name: fit(case) for name, case in fits.items()}
    loaded = [load_into(path, case) for path, case in loads]
    return {"fits": out, "loads": loaded} if int(os.environ.get("RANK", "0")) == 0 else None
