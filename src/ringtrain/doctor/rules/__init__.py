"""The checks, one function per rule id; each yields (node, message, hint) for its findings, or (node, message,
hint, severity) where the rule's lesser severity applies (findings.Rule.lesser: the file leaves its condition open).

The node decides the reported line (and the lines a ``# ringtrain: ignore[rule]`` comment
may sit on). Grouped by what they look at: data loading, checkpoints, the model wrap,
the process group, metrics, Horovod, sharded training (FSDP), random splits, devices,
evaluation on one rank, and scripts that use ringtrain's Ring (its window and setup; what its checkpoints
cannot see).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..script import Script
from . import (checkpoints, data, devices, evaluation, horovod, metrics, model, process_group, randomness, resume,
               ring, ring_use, sharding, wrapping)

Report = tuple  # (ast node, message, hint[, severity])
Check = Callable[[Script], Iterable[Report]]

CHECKS: dict[str, Check] = {
    "sampler-set-epoch": data.sampler_set_epoch,
    "save-every-rank": checkpoints.save_every_rank,
    "local-rank-arg": process_group.local_rank_arg,
    "ddp-before-to": model.ddp_before_to,
    "shuffle-with-sampler": data.shuffle_with_sampler,
    "eval-sampler-padding": data.eval_sampler_padding,
    "accumulate-no-sync": model.accumulate_no_sync,
    "load-map-location": checkpoints.load_map_location,
    "syncbn-after-ddp": model.syncbn_after_ddp,
    "set-device": process_group.set_device,
    "nccl-without-cuda": process_group.nccl_without_cuda,
    "rank-from-local-rank": process_group.rank_from_local_rank,
    "collective-on-one-rank": process_group.collective_on_one_rank,
    "unreduced-metric": metrics.unreduced_metric,
    "batch-size-float": data.batch_size_float,
    "sampler-dataset-mismatch": data.sampler_dataset_mismatch,
    "hvd-broadcast": horovod.hvd_broadcast,
    "hvd-lr-scale": horovod.hvd_lr_scale,
    "dataparallel-batch": model.dataparallel_batch,
    "optimizer-before-shard": sharding.optimizer_before_shard,
    "sharded-state-on-one-rank": sharding.sharded_state_on_one_rank,
    "save-sharded-every-rank": sharding.save_sharded_every_rank,
    "fsdp1-api": sharding.fsdp1_api,
    "unseeded-split": randomness.unseeded_split,
    "model-not-wrapped": wrapping.model_not_wrapped,
    "ranks-share-device": devices.ranks_share_device,
    "eval-on-one-rank-through-ddp": evaluation.eval_on_one_rank_through_ddp,
    "loss-divided-with-ring-accumulate": ring.loss_divided_with_ring_accumulate,
    "backward-without-ring": ring_use.backward_without_ring,
    "optimizer-not-given-to-setup": ring_use.optimizer_not_given_to_setup,
    "ring-save-on-one-rank": ring_use.ring_save_on_one_rank,
    "prefetched-batch": resume.prefetched_batch,
    "loader-position-not-kept": resume.loader_position_not_kept,
}
