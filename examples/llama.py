"""A Llama-shaped language model (torchtitan's layer names: wq/wk/wv/wo, w1/w2/w3 SwiGLU, RMSNorm, grouped-query
attention) trained with ``ring.steps`` on synthetic tokens — the script ``ringtrain plan`` is shown on.

    python examples/llama.py                                             # tiny, one process
    ringtrain run --nproc-per-node 2 examples/llama.py                   # DDP
    ringtrain plan --nproc-per-node 8 examples/llama.py --size 1b        # will 1.5 B parameters fit on 8 H100s?

``--size 1b`` is Llama 3.2 1B's shape with untied embeddings (1.50 B parameters, sequence 2048); it is built on the
meta device (``ring.setup`` allocates only what a rank holds, under FSDP; ``ringtrain plan`` allocates nothing).
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

import ringtrain as rt

SIZES = {  # dim, layers, heads, kv heads, ffn, vocab, sequence
    "tiny": (64, 2, 4, 2, 256, 256, 32),
    "1b": (2048, 16, 32, 8, 8192, 128256, 2048),
}


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int, n_kv_heads: int):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1, self.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, hidden: int):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.attention = Attention(dim, n_heads, n_kv_heads)
        self.feed_forward = FeedForward(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, dim: int, n_layers: int, n_heads: int, n_kv_heads: int, hidden: int, vocab: int):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, n_heads, n_kv_heads, hidden) for _ in range(n_layers))
        self.norm = nn.RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def build(size: str) -> tuple[Llama, int, int]:
    """The model of ``size`` (on the meta device unless tiny), its vocabulary and sequence length."""
    dim, layers, heads, kv, hidden, vocab, seq = SIZES[size]
    with torch.device("meta" if size != "tiny" else "cpu"):
        return Llama(dim, layers, heads, kv, hidden, vocab), vocab, seq


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--precision", default="bf16-mixed")
    args = parser.parse_args()
    ring = rt.Ring(seed=0, precision=args.precision)
    model, vocab, seq = build(args.size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    model, optimizer = ring.setup(model, optimizer)
    for step in ring.steps(args.steps):
        tokens = torch.randint(0, vocab, (args.batch, seq + 1), device=ring.device)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        ring.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        ring.print(f"step {step}: loss {loss.item():.3f}")
    ring.close()


if __name__ == "__main__":
    main()
