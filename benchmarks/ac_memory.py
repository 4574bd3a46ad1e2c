"""Activation checkpointing's memory, measured: peak of one training step with AC off, full and selective.

    python benchmarks/ac_memory.py                          # GPT-style, 6 blocks of width 256, batch 8 x 256 tokens
    python benchmarks/ac_memory.py --layers 12 --width 512  # larger

The model is a GPT-style decoder (token + position embeddings, pre-norm blocks of causal multi-head attention and a
4x MLP, a final norm, an untied head), its blocks checkpointed by ringtrain's ``apply_activation_checkpointing``
(strategies/checkpointing.py) — the function ``Ring(activation_checkpointing=...)`` calls. One forward + backward
+ SGD step runs under torch's ``MemTracker`` (torch.distributed._tools.mem_tracker: every tensor allocated, by kind),
in one process on the CPU; the table has its peak, split into parameters, gradients, activations and temporaries,
and the step's time (median of ``--repeat`` steps after one warm-up, without the tracker). The weights after the
step are compared with AC off: equal bit for bit is what the tests require too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from ringtrain.strategies import apply_activation_checkpointing

MiB = 2 ** 20


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.q, self.k, self.v, self.proj = (nn.Linear(width, width) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        h = self.ln1(x)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (self.q(h), self.k(h), self.v(h)))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, width: int, heads: int, layers: int, seq: int):
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, width), nn.Embedding(seq, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def measure(mode: str | None, args: argparse.Namespace, x: torch.Tensor, y: torch.Tensor) -> dict:
    from torch.distributed._tools.mem_tracker import MemTracker

    torch.manual_seed(0)
    model = GPT(args.vocab, args.width, args.heads, args.layers, args.seq)
    apply_activation_checkpointing(model, mode)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        step(model, optimizer, x, y)
    peak = next(iter(tracker.get_tracker_snapshot("peak").values()))
    kinds = {getattr(k, "name", k).lower(): v / MiB for k, v in peak.items()}  # PARAM, GRAD, ACT, TEMP..., Total
    times = []
    for i in range(args.repeat + 1):
        start = time.perf_counter()
        step(model, optimizer, x, y)
        if i:
            times.append(time.perf_counter() - start)
    return {"mode": mode or "off", "peak_mib": kinds["total"], "activations_mib": kinds.get("act", 0.0),
            "temporaries_mib": kinds.get("temp", 0.0), "parameters_mib": kinds.get("param", 0.0),
            "gradients_mib": kinds.get("grad", 0.0), "optimizer_mib": kinds.get("opt", 0.0), "step_ms": 1000 * statistics.median(times),
            "weights": {k: v.clone() for k, v in model.state_dict().items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="one JSON line instead of the table")
    args = parser.parse_args()
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
    x, y = tokens[:, :-1], tokens[:, 1:]
    rows = [measure(mode, args, x, y) for mode in (None, "full", "selective")]
    off = rows[0]["weights"]
    for row in rows:
        weights = row.pop("weights")
        row["max_weight_diff_vs_off"] = max((weights[k] - off[k]).abs().max().item() for k in off)
    params = sum(p.numel() for p in GPT(args.vocab, args.width, args.heads, args.layers, args.seq).parameters())
    if args.json:
        print(json.dumps({"parameters": params, "args": vars(args), "rows": rows}))
        return
    print(f"GPT {args.layers} x {args.width} ({params / 1e6:.2f}M parameters), batch {args.batch} x {args.seq} tokens, "
          f"torch {torch.__version__}, one CPU process")
    print("| AC | peak MiB | activations MiB | temporaries MiB | params + grads MiB | step ms | weights vs off |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['peak_mib']:.1f} | {r['activations_mib']:.1f} | {r['temporaries_mib']:.1f} | "
              f"{r['parameters_mib'] + r['gradients_mib']:.1f} | {r['step_ms']:.0f} | {r['max_weight_diff_vs_off']:.1e} |")


if __name__ == "__main__":
    main()
