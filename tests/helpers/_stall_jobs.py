"""Jobs where one rank stops making progress while staying alive, for tests/test_stall.py.

``ringtrain run --nproc-per-node 2 _stall_jobs.py MODE [--timeout S]``: a small DDP loop through
rt.Ring (stall_warning from RINGTRAIN_STALL_WARNING, set by the test); at step ``STALL_STEP``
rank 1 (or rank 0, for ``extra``) misbehaves:

* ``data``   — rank 1's data step never ends (a dataset whose __getitem__ sleeps);
* ``spin``   — rank 1 spins in a Python loop outside any collective;
* ``sigstop``— rank 1 stops itself (SIGSTOP): frozen, it cannot answer;
* ``extra``  — rank 0 calls ring.all_reduce once more than rank 1 (which goes on to its backward);
* ``slow``   — no stall: rank 1's data loading takes 40 ms longer per batch, for the whole run;
* ``slowstep``— no stall either: from step 3, rank 1 takes 2 s more per step (outside any collective), so
  rank 0 spends most of each step waiting in backward — moving, step after step;
* ``native`` — rank 1 holds the GIL in native code (libc's sleep through ctypes.PyDLL): its watchdog
  cannot answer, and its published position goes stale;
* ``plain``  — a plain torch.distributed script (no ringtrain API): rank 1 sleeps before an all_reduce;
* ``hook``   — rank 1's backward never ends in its own code: a backward hook of the script's that sleeps (it
  computes, it waits for no peer), while rank 0 waits for it in the gradient all-reduce.

Each line the job prints to stdout starts with ``JOB``; a rank that was never stopped prints
``JOB done``. Faults come from the outside only (this file), the library has no test hooks.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

STALL_STEP = 3
STEPS = 10_000


def say(text: str) -> None:
    """One line to stdout in one write: the ranks share the launcher's stdout, and print() writes the
    text and the newline separately (lines of two ranks would run together)."""
    sys.stdout.write(f"JOB {text}\n")
    sys.stdout.flush()


def _dataset(mode: str, rank: int):
    import torch
    from torch.utils.data import Dataset

    class Data(Dataset):
        def __init__(self):
            g = torch.Generator().manual_seed(0)
            self.x, self.y = torch.randn(4096, 8, generator=g), torch.randint(0, 2, (4096,), generator=g)
            self.calls = 0

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            self.calls += 1
            if mode == "data" and rank == 1 and self.calls > STALL_STEP * 8:
                time.sleep(10_000)  # the data step that never ends
            return self.x[i], self.y[i]

    return Data()


def ring_job(mode: str, timeout: float | None, steps: int) -> None:
    import torch
    import torch.nn.functional as F

    import ringtrain as rt

    ring = rt.Ring(seed=0, **({"timeout": timeout} if timeout else {}))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.01))
    loader = ring.loader(_dataset(mode, ring.rank), batch_size=8)
    step = 0
    for x, y in loader:
        if step == STALL_STEP:
            time.sleep(1.5)  # every rank's watchdog has published where it is (once a second)
            say(f"fault rank={ring.rank} mode={mode} t={time.time():.3f}")
            if mode == "spin" and ring.rank == 1:
                deadline = time.monotonic() + 10_000
                while time.monotonic() < deadline:
                    sum(range(1000))
            if mode == "sigstop" and ring.rank == 1:
                os.kill(os.getpid(), signal.SIGSTOP)
            if mode == "native" and ring.rank == 1:
                import ctypes

                ctypes.PyDLL(None).sleep(10_000)  # the native call that holds the GIL
            if mode == "hook" and ring.rank == 1:
                def stuck_in_backward(grad):
                    time.sleep(10_000)  # the backward hook that never ends
                    return grad

                next(model.parameters()).register_hook(stuck_in_backward)
            if mode == "extra" and ring.rank == 0:
                ring.all_reduce(torch.ones(3))  # rank 1 never calls this one
        if mode == "slowstep" and ring.rank == 1 and step >= STALL_STEP:
            time.sleep(2.0)  # a slow step, not a stuck one
        ring.backward(F.cross_entropy(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
        step += 1
        if step >= steps:
            break
    say(f"done rank={ring.rank} steps={step}")
    stats = ring.stats()
    if ring.is_main:
        say(f"stats {stats}")
    ring.close()


def plain_job() -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(STEPS):
        if step == STALL_STEP and rank == 1:
            say(f"fault rank=1 mode=plain t={time.time():.3f}")
            time.sleep(10_000)
        dist.all_reduce(torch.ones(4))
    say("done")


def slow_loader_job(steps: int) -> None:
    """``slow``: rank 1's loader takes 40 ms longer per batch (in the dataset: the data wait ring.loader times)."""
    import torch
    import torch.nn.functional as F
    from torch.utils.data import Dataset

    import ringtrain as rt

    ring = rt.Ring(seed=0)

    class Slow(Dataset):
        def __init__(self):
            self.x, self.y = torch.randn(8192, 8), torch.randint(0, 2, (8192,))
            self.calls = 0

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            self.calls += 1
            if ring.rank == 1 and self.calls % 8 == 0:
                time.sleep(0.04)  # once per batch of 8
            return self.x[i], self.y[i]

    model = torch.nn.Sequential(torch.nn.Linear(8, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2))
    model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.01))
    loader = ring.loader(Slow(), batch_size=8)
    for epoch in ring.epochs(1):
        for step, (x, y) in enumerate(loader):
            ring.backward(F.cross_entropy(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
            if step + 1 >= steps:
                break
    stats = ring.stats()
    if ring.is_main:
        say(f"stats {stats}")
    say(f"done rank={ring.rank}")
    ring.close()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["data", "spin", "sigstop", "extra", "slow", "slowstep", "native", "plain",
                                         "clean", "hook"])
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--steps", type=int, default=STEPS)
    args = parser.parse_args(argv)
    if args.mode == "plain":
        plain_job()
    elif args.mode == "slow":
        slow_loader_job(args.steps)
    else:
        ring_job(args.mode, args.timeout, args.steps)


if __name__ == "__main__":
    main(sys.argv[1:])
