"""What `ringtrain doctor` reports: a finding, its severity, and the catalogue of rules.

A rule is data (id, severity, one-line summary) plus a check function elsewhere; keeping
the catalogue here lets the CLI list, validate (``--ignore``) and document the rules
without importing the checks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# Ordered from most to least serious; the summary line counts them in this order.
SEVERITIES = ("error", "warning", "note")


@dataclass(frozen=True)
class Rule:
    id: str
    severity: str  # the severity when the condition the finding names is visible in the file
    summary: str
    # A lower severity the same rule gives when the file leaves that condition open (a strategy read from the
    # environment, a model whose buffers the file does not show); the finding's message then names the condition.
    lesser: str | None = None


@dataclass(frozen=True)
class Finding:
    file: str
    line: int
    rule: str
    message: str
    hint: str
    severity: str

    def to_json(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        return f"{self.file}:{self.line}: {self.rule}: {self.severity}: {self.message}\n    HINT: {self.hint}"


# error: the script crashes or hangs; warning: it runs but trains or reports wrongly, or
# slower than it should; note: a fact about the script's semantics worth knowing.
RULES: dict[str, Rule] = {r.id: r for r in (
    Rule("sampler-set-epoch", "warning",
         "a DistributedSampler drives a training loader in an epoch loop that never calls set_epoch"),
    Rule("save-every-rank", "warning",
         "torch.save in a distributed script, not guarded by a rank-0 check"),
    Rule("local-rank-arg", "error",
         "argparse declares --local_rank only; torch >= 2.0 launchers pass --local-rank"),
    Rule("ddp-before-to", "error",
         "a model wrapped in DistributedDataParallel before it is moved to its device"),
    Rule("shuffle-with-sampler", "error",
         "DataLoader(shuffle=True) together with a sampler: a ValueError at run time"),
    Rule("eval-sampler-padding", "warning",
         "a padding DistributedSampler on an evaluation set whose metrics are reduced"),
    Rule("accumulate-no-sync", "warning",
         "gradient accumulation under DDP without no_sync(): every micro-batch all-reduces"),
    Rule("load-map-location", "warning",
         "torch.load without map_location, fed to load_state_dict, in a distributed CUDA script"),
    Rule("syncbn-after-ddp", "warning",
         "convert_sync_batchnorm applied after the DDP wrap"),
    Rule("set-device", "warning",
         "a CUDA script starts NCCL (or Horovod) without ever calling torch.cuda.set_device"),
    Rule("nccl-without-cuda", "error",
         "backend='nccl' in a script that keeps its model and tensors on the CPU"),
    Rule("rank-from-local-rank", "warning",
         "init_process_group(rank=local_rank): right on one machine, a hang on several"),
    Rule("collective-on-one-rank", "error",
         "a collective called only under a rank-0 check: the other ranks never join it"),
    Rule("unreduced-metric", "warning",
         "an evaluation metric of one rank's shard printed without any reduction across ranks"),
    Rule("batch-size-float", "error",
         "DataLoader batch_size computed with '/', a float"),
    Rule("sampler-dataset-mismatch", "error",
         "a DataLoader reads one dataset while its DistributedSampler shards another"),
    Rule("hvd-broadcast", "warning",
         "hvd.DistributedOptimizer without hvd.broadcast_parameters"),
    Rule("hvd-lr-scale", "note",
         "Horovod learning rate not scaled with hvd.size()"),
    Rule("dataparallel-batch", "note",
         "nn.DataParallel splits each batch across GPUs; DDP's batch_size is per process"),
    Rule("optimizer-before-shard", "error",
         "the optimizer is built before fully_shard (or FSDP1's wrap) replaces the model's parameters"),
    Rule("sharded-state-on-one-rank", "error",
         "a sharded model's state dict taken on rank 0 only: a collective that hangs, or a partial checkpoint"),
    Rule("save-sharded-every-rank", "error",
         "every rank torch.saves its own shard of a sharded state dict to one path"),
    Rule("fsdp1-api", "note",
         "FSDP1 (FullyShardedDataParallel) where FSDP2's fully_shard serves"),
    Rule("unseeded-split", "warning",
         "random_split/randperm choose each rank's samples without a seed shared by the ranks"),
    Rule("model-not-wrapped", "warning",
         "a path (the CPU one, say) forms the group and shards the data but never wraps the model"),
    Rule("ranks-share-device", "warning",
         "a device map, (rank * k + i) % world_size, that puts two ranks on one GPU"),
    Rule("eval-on-one-rank-through-ddp", "error",
         "a forward of the DDP (or FSDP) model on one rank only: its broadcast or all-gather goes unmatched "
         "(a warning when the file does not show that the DDP model has buffers)", lesser="warning"),
    Rule("loss-divided-with-ring-accumulate", "warning",
         "the loss divided by the accumulation count before ring.backward, which divides it too"),
    Rule("backward-without-ring", "error",
         "loss.backward() where the Ring accumulates or runs fp16: only ring.backward windows and scales"),
    Rule("optimizer-not-given-to-setup", "error",
         "an optimizer built on the model's parameters is not given to ring.setup, which shards them under FSDP "
         "(a warning when the strategy is not written in the file)", lesser="warning"),
    Rule("ring-save-on-one-rank", "error",
         "ring.save or ring.load under a rank-0 check: every rank must call it, guarded it hangs"),
    Rule("prefetched-batch", "warning",
         "a batch drawn before the loop and again after each forward: a resumed run trains another batch first"),
    Rule("loader-position-not-kept", "warning",
         "the script's own loader keeps a position the checkpoints do not: a resumed run restarts its data"),
)}
