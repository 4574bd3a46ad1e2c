"""Fixed: FSDP2 through a module alias; the full state gathered with torch.distributed.checkpoint."""
import torch
import torch.distributed as dist
import torch.distributed.fsdp as fsdp_lib
from torch import nn
from torch.distributed.checkpoint import state_dict as dcp_state


def wrap(module):
    return fsdp_lib.fully_shard(module)


def save(model, path):
    options = dcp_state.StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = dcp_state.get_model_state_dict(model, options=options)
    if dist.get_rank() == 0:
        torch.save(state, path)


if __name__ == "__main__":
    dist.init_process_group("gloo")
    encoder = wrap(nn.Linear(8, 8))
    decoder = fsdp_lib.fully_shard(nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(list(encoder.parameters()) + list(decoder.parameters()))
    save(encoder, "encoder.pt")
