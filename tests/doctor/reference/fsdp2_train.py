"""FSDP2 as pytorch/examples' distributed/FSDP2 teaches it: a transformer built on the meta device,
fully_shard on each block and then on the root, the optimizer built on the shards, and two ways to
checkpoint — torch.distributed.checkpoint's getters (a full state gathered to rank 0 on the CPU),
or the DTensor shards gathered by hand with full_tensor() — both run on every rank, with only the
write on rank 0; plus a sharded checkpoint written by dcp.save. Launch: torchrun --nproc-per-node 2."""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    def __init__(self, vocab, dim=64, heads=4, depth=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class Checkpointer:
    def __init__(self, folder, dcp_api):
        self.folder = folder
        self.dcp_api = dcp_api

    def _full_model_state(self, model: FSDPModule):
        if self.dcp_api:
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            return get_model_state_dict(model=model, options=options)
        cpu_state = {}
        for name, shard in model.state_dict().items():
            full = shard.full_tensor()  # a collective: every rank takes part
            if dist.get_rank() == 0:
                cpu_state[name] = full.cpu()
        return cpu_state

    def _full_optimizer_state(self, model: FSDPModule, optimizer):
        if self.dcp_api:
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            return get_optimizer_state_dict(model=model, optimizers=optimizer, options=options)
        sharded = optimizer.state_dict()
        state = {}
        for group_id, group in sharded["state"].items():
            values = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in group.items()}
            if dist.get_rank() == 0:
                state[group_id] = {k: v.cpu() for k, v in values.items()}
        return {"param_groups": sharded["param_groups"], "state": state}

    def save(self, model, optimizer):
        model_state = self._full_model_state(model)
        optimizer_state = self._full_optimizer_state(model, optimizer)
        if dist.get_rank() == 0:
            folder = os.path.join(self.folder, str(int(time.time() * 1000)))
            os.makedirs(folder, exist_ok=True)
            torch.save(model_state, os.path.join(folder, "model.pt"))
            torch.save(optimizer_state, os.path.join(folder, "optimizer.pt"))

    def save_sharded(self, model, optimizer, step):
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        dcp.save(state, checkpoint_id=os.path.join(self.folder, f"step{step}"))


def main(args):
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", device_id=device)
    torch.manual_seed(0)

    with torch.device("meta"):
        model = Transformer(vocab=1024)
    fsdp_kwargs = {}
    if args.mixed_precision:
        fsdp_kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, **fsdp_kwargs)
    fully_shard(model, **fsdp_kwargs)
    model.to_empty(device=device)
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    checkpointer = Checkpointer("checkpoints", dcp_api=args.dcp_api)
    for step in range(args.steps):
        tokens = torch.randint(0, 1024, (8, 64), device=device)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        optimizer.zero_grad()
        if step % 50 == 0:
            checkpointer.save_sharded(model, optimizer, step)
    checkpointer.save(model, optimizer)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="FSDP2 training")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--mixed-precision", action="store_true")
    parser.add_argument("--dcp-api", action="store_true")
    main(parser.parse_args())
