"""A checkpoint module of an FSDP1 project: no wrap here, only its state-dict configuration
(the note goes to the first FSDP1 name the file uses)."""
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP


def save_checkpoint(model, optimizer, path):
    FSDP.set_state_dict_type(  # expect: fsdp1-api
        model,
        StateDictType.FULL_STATE_DICT,
        FullStateDictConfig(offload_to_cpu=True, rank0_only=True),
        FullOptimStateDictConfig(offload_to_cpu=True, rank0_only=True),
    )
    state = {"model": model.state_dict(), "optimizer": FSDP.optim_state_dict(model, optimizer)}
    if dist.get_rank() == 0:
        torch.save(state, path)
