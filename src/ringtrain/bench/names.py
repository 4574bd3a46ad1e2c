"""The bench's words — its modes and workloads — without torch: ``ringtrain bench`` checks its command line
against them before the measuring modules (and torch) load, so a wrong argument is refused at once."""

MODES = ("single", "dp", "ddp", "ddp+accumulate", "ddp+ac", "ddp+bf16", "ddp+powersgd", "ddp+auto", "fsdp", "tp", "hvd",
         "hvd+fp16", "pipeline", "raw-ddp")
TP_SIZE = 2  # the tp mode: tensor parallel over pairs of ranks, DDP replicas of the pairs (rt.strategies.DDP(tp=2))
COMPRESSED = {"ddp+bf16": "bf16", "ddp+powersgd": "powersgd", "ddp+auto": "auto"}  # DDP(compression=...)
WORKLOADS = ("digits-cnn", "cifar-resnet18", "mlp", "unet3d")
# The workloads whose models have BatchNorm layers: the ones --sync-bn changes.
WITH_BATCHNORM = ("cifar-resnet18", "unet3d")
EXTRA = "bench"  # pyproject.toml's extra the bench needs: matplotlib (throughput.png), scikit-learn (the digits)
