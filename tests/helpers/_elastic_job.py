"""The training script of the elastic scale-up test (test_launch_elastic.py), run by `ringtrain run`.

Ring(checkpoint_dir=..., save_every=2) over 64 indexed samples, 2 per device, 2 epochs; every
optimizer step is logged as a JSON line (world size, step, epoch, the samples' indices) in
LOG/<rank>-<pid>.jsonl. Alone (world size 1), the job stops after step STOP and blocks: it can
only go on when a second node joins and the agent re-forms the group, restarting the workers,
which resume from the newest checkpoint at world size 2.
"""

import json
import os
import sys
import threading
import time

import torch
import torch.nn.functional as F

import ringtrain as rt

STOP = 6

folder, log = sys.argv[1], sys.argv[2]
ring = rt.Ring(seed=0, checkpoint_dir=folder, save_every=2, keep_last=2)
torch.set_num_threads(1)
model = torch.nn.Linear(4, 2)
model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
g = torch.Generator().manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(64, 4, generator=g), torch.randint(0, 2, (64,), generator=g),
                                      torch.arange(64))
loader = ring.loader(data, batch_size=2, shuffle=True)
with open(os.path.join(log, f"{ring.rank}-{os.getpid()}.jsonl"), "a") as f:
    for epoch in ring.epochs(2):
        for x, y, idx in loader:
            ring.backward(F.cross_entropy(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
            f.write(json.dumps({"t": time.time(), "world": ring.world_size, "step": ring.optimizer_steps,
                                "epoch": epoch, "idx": idx.tolist()}) + "\n")
            f.flush()
            if ring.world_size == 1 and ring.optimizer_steps == STOP:
                threading.Event().wait()  # until the agent re-forms the group with the new node (SIGTERM)
sys.stdout.write(f"RESULT rank={ring.rank} world={ring.world_size} steps={ring.optimizer_steps}\n")
ring.close()
