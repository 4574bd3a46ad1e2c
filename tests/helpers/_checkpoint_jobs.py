"""Jobs where a checkpoint is reached by some ranks only, for tests/liveness/test_checkpoint_deadlock.py.

``ringtrain run --nproc-per-node 2 _checkpoint_jobs.py MODE``: a small DDP loop through rt.Ring on a tiny
model; after optimizer step ``FAULT_STEP``:

* ``save`` — ``if ring.is_main: ring.save(...)``: torch's ``if dist.get_rank() == 0: torch.save(...)``,
  translated literally (issue 36, item 7); rank 1 goes on into the next step's gradient all-reduce;
* ``load`` — every rank saved a sharded folder first; ``if ring.is_main: ring.load(...)`` of it (a sharded
  load is collective; a full file's is not);
* ``slow`` — no deadlock: every rank calls ring.save, but rank 1 first spends ``SLOW_S`` seconds in an
  evaluation forward of the DDP model (which the watchdog sees as the engine's frames) while rank 0 waits in
  ring.save; the job must finish.

Each line the job prints to stdout starts with ``JOB``: ``JOB fault rank=R t=T`` at the fault, ``JOB done
rank=R`` at a normal end.
"""

from __future__ import annotations

import sys
import time

FAULT_STEP = 4
STEPS = 40
SLOW_S = 8.0


def say(text: str) -> None:
    """One line to stdout in one write (the ranks share the launcher's stdout)."""
    sys.stdout.write(f"JOB {text}\n")
    sys.stdout.flush()


def main(mode: str) -> None:
    import torch
    import torch.nn.functional as F

    import ringtrain as rt

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 2)
            self.slow = 0.0  # seconds the next forward sleeps (an evaluation that takes long)

        def forward(self, x):
            if self.slow:
                time.sleep(self.slow)
                self.slow = 0.0
            return self.linear(x)

    ring = rt.Ring(strategy="ddp", seed=0)
    torch.set_num_threads(1)
    model = Tiny()
    model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    data = torch.utils.data.TensorDataset(torch.randn(512, 4), torch.randint(0, 2, (512,)))
    if mode == "load":
        ring.save("ckdir", full=False, model=model, optimizer=optimizer)  # every rank: a sharded folder
    for x, y in ring.loader(data, batch_size=8):
        ring.backward(F.cross_entropy(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
        if ring.optimizer_steps == FAULT_STEP:
            time.sleep(1.5)  # every rank's watchdog has published where it is (once a second)
            say(f"fault rank={ring.rank} t={time.time():.3f}")
            if mode == "save" and ring.is_main:
                ring.save("ckpt.pt", model=model, optimizer=optimizer)  # on rank 0 only: it waits for ever
            elif mode == "load" and ring.is_main:
                ring.load("ckdir", model=model, optimizer=optimizer)  # on rank 0 only: it waits for ever
            elif mode == "slow":
                if ring.rank == 1:
                    model.eval()
                    with torch.no_grad():
                        model.module.slow = SLOW_S
                        model(x)  # a long evaluation, in DDP's forward: no collective
                    model.train()
                ring.save("ckpt.pt", model=model, optimizer=optimizer)  # every rank: fine, however late
        if ring.optimizer_steps >= STEPS:
            break
    say(f"done rank={ring.rank}")
    ring.close()


if __name__ == "__main__":
    main(sys.argv[1])
