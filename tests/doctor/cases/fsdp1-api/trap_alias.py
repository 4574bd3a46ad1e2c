"""FSDP1 through a module alias, wrapping two models (one note for the file, at the first wrap),
and a checkpoint helper that sets FSDP1's state-dict type."""
import torch
import torch.distributed as dist
import torch.distributed.fsdp as fsdp_lib
from torch import nn


def wrap(module):
    return fsdp_lib.FullyShardedDataParallel(module, use_orig_params=True)  # expect: fsdp1-api


def save(model, path):
    config = fsdp_lib.FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
    with fsdp_lib.FullyShardedDataParallel.state_dict_type(model, fsdp_lib.StateDictType.FULL_STATE_DICT, config):
        state = model.state_dict()
    if dist.get_rank() == 0:
        torch.save(state, path)


if __name__ == "__main__":
    dist.init_process_group("gloo")
    encoder = wrap(nn.Linear(8, 8))
    decoder = fsdp_lib.FullyShardedDataParallel(nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(list(encoder.parameters()) + list(decoder.parameters()))
    save(encoder, "encoder.pt")
