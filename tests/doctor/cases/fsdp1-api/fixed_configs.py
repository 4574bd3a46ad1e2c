"""Fixed: the same checkpoint written with torch.distributed.checkpoint.state_dict, for FSDP2."""
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict


def save_checkpoint(model, optimizer, path):
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
    if dist.get_rank() == 0:
        torch.save({"model": model_state, "optimizer": optimizer_state}, path)
