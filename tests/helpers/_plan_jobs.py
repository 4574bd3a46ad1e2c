"""Real runs the plan is checked against (tests/planning/test_accuracy.py), on real Gloo ranks.

Three tiny models — an MLP of repeated blocks, a CNN of conv + BatchNorm blocks, a transformer of 2 blocks (causal
SDPA, 4 heads) — each trained for two steps with AdamW in a layout laid out with the calls the strategies make
(DistributedDataParallel; fully_shard on strategies/_units.py's units; the inferred TP plan of _tp_plan/_tp_apply;
strategies/checkpointing.py's activation checkpointing), under torch's memory tracker (``MemTracker``,
``FSDPMemTracker`` for FSDP) entered before the layout is built, so DDP's buckets are seen. ``job`` returns rank
0's peak per case.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ringtrain.planning import trace as tracing
from ringtrain.planning.layouts import Layout
from ringtrain.strategies import _tp_apply, _tp_plan, _units


class MLP(nn.Module):
    def __init__(self, width: int = 256, depth: int = 4, classes: int = 10):
        super().__init__()
        self.blocks = nn.Sequential(*(nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


class CNN(nn.Module):
    def __init__(self, channels: int = 16, depth: int = 3, classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.blocks = nn.Sequential(*(nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1, bias=False),
                                                    nn.BatchNorm2d(channels), nn.ReLU()) for _ in range(depth)))
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (m(x).view(b, t, self.n_heads, -1).transpose(1, 2) for m in (self.q, self.k, self.v))
        return self.o(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, dim: int, n_heads: int):
        super().__init__()
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(dim), Attention(dim, n_heads), nn.LayerNorm(dim)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class Transformer(nn.Module):
    def __init__(self, vocab: int = 128, dim: int = 64, n_heads: int = 4, depth: int = 2):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, n_heads) for _ in range(depth))
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.emb(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


MODELS = {"mlp": MLP, "cnn": CNN, "transformer": Transformer}


def batch_of(name: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if name == "mlp":
        return torch.randn(64, 256, generator=g)
    if name == "cnn":
        return torch.randn(16, 3, 32, 32, generator=g)
    return torch.randint(0, 128, (8, 64), generator=g)


LAYOUTS = {
    "ddp": Layout("ddp", dp_replicate=2),
    "fsdp": Layout("fsdp", dp_shard=2),
    "fsdp+ac": Layout("fsdp", dp_shard=2, ac="full"),
    "fsdp+sac": Layout("fsdp", dp_shard=2, ac="selective"),
    "tp": Layout("single", tp=2),
}
CASES = [(m, l) for m in MODELS for l in ("ddp", "fsdp", "fsdp+ac")] + [("transformer", "fsdp+sac"),
                                                                         ("transformer", "tp")]


def _laid_out(model: nn.Module, layout: Layout) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if layout.data == "ddp":
        tracing.checkpoint_blocks(model, layout.ac)
        return nn.parallel.DistributedDataParallel(model)
    if layout.tp > 1:
        mesh = init_device_mesh("cpu", (layout.tp,), mesh_dim_names=("tp",))
        _tp_apply.apply(model, _tp_plan.infer(model, layout.tp, False), mesh, layout.tp)
        tracing.checkpoint_blocks(model, layout.ac)
        return model
    mesh = init_device_mesh("cpu", (layout.dp_shard,), mesh_dim_names=("dp_shard",))
    units = _units.choose(model, "auto")
    tracing.checkpoint_blocks(model, layout.ac)
    for name in units:
        fully_shard(model.get_submodule(name), mesh=mesh)
    fully_shard(model, mesh=mesh, reshard_after_forward=False)
    return model


def measure(name: str, layout_name: str) -> int:
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    torch.manual_seed(0)
    layout = LAYOUTS[layout_name]
    model = MODELS[name]()
    batch = batch_of(name)
    if layout.data == "fsdp":
        model = _laid_out(model, layout)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        tracker = FSDPMemTracker(model, opt)
        tracker.track_inputs((batch,))
        with tracker:
            _steps(model, opt, batch, tracker)
    else:
        tracker = MemTracker()
        tracker.track_external(model, batch)
        with tracker:  # entered before DDP is built: its buckets are allocated inside
            model = _laid_out(model, layout)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            _steps(model, opt, batch, tracker)
    return sum(dev["Total"] for dev in tracker.get_tracker_snapshot("peak").values())


def _steps(model: nn.Module, opt: torch.optim.Optimizer, batch: torch.Tensor, tracker) -> None:
    for step in range(2):
        loss = tracing.default_loss(model(batch))
        loss.backward()
        del loss
        opt.step()
        opt.zero_grad()
        if step == 0:
            tracker.reset_mod_stats()  # the tracker's per-module stats hold one iteration; the peak holds both


def job(cases: list[tuple[str, str]]) -> dict[str, int]:
    dist.init_process_group("gloo")
    try:
        return {f"{m}/{l}": measure(m, l) for m, l in cases}
    finally:
        dist.destroy_process_group()


def ring_runs(runs: list[tuple[str, dict]], steps: int = 3) -> list[tuple[str, dict[str, torch.Tensor], bool]]:
    """Each ``(strategy, keywords)``: the MLP trained ``steps`` steps by a Ring (AdamW, the planned batch on every
    rank) with those keywords (``plan=``, ``log_dir=``); what this rank printed, and its weights (this rank's shards
    under FSDP) after, and whether the plan's check had left no tracker or hook after step 1."""
    import contextlib
    import tempfile

    from torch.optim import optimizer as optimizers

    import ringtrain as rt

    out = []
    for strategy, keywords in runs:
        torch.manual_seed(0)
        with tempfile.TemporaryFile("w+") as said, contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            ring = rt.Ring(strategy=strategy, seed=0, device="cpu", **keywords)
            model = MLP()
            model, opt = ring.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
            batch = batch_of("mlp")
            for step in range(steps):
                ring.backward(tracing.default_loss(model(batch)))
                opt.step()
                opt.zero_grad()
                if step == 0:  # the check is over: no tracker, no hook of its is left to slow the steps after
                    detached = (torch._C._len_torch_dispatch_stack() == 0 and not ring._step.stepped_hooks
                                and not optimizers._global_optimizer_post_hooks
                                and not opt._optimizer_step_pre_hooks)
            weights = {n: (p.to_local() if hasattr(p, "to_local") else p).detach().clone()
                       for n, p in ring.unwrap(model).named_parameters()}
            ring.close()
            said.seek(0)  # a file, not a StringIO: faulthandler (the ring's bounded exit) needs stderr's fileno
            out.append((said.read(), weights, detached))
    return out
