"""A step-based loop as LLM scripts write it (issue 30), for ``ringtrain run`` and kill -9 tests:

    ringtrain run --nproc-per-node 2 --max-restarts 1 _steps_jobs.py --out OUT [--strategy fsdp] [--kill-at N]

``for step in ring.steps(STEPS)``: its own ``get_batch`` (micro-batch ``(step, i)`` of the job's global batch,
rank r taking ``i = r*k .. r*k+k-1``, so one process with ``accumulate=k*W`` sees the same samples), k = 2
``ring.backward`` calls then one ``optimizer.step()``, random numbers drawn right after the step, and an
evaluation on random batches (the global RNG) every ``EVAL`` steps, before the step's first batch — what must
come out identical after a restart. ``save_every=5``. ``--kill-at N``: rank 1 SIGKILLs itself at its N-th
``ring.backward`` of the first attempt. ``--preempt-at N --preempt-how launcher|rank1|self``: at its N-th
``ring.backward`` of a first run (no checkpoint yet), rank 1 sends ``--preempt-signal`` (SIGTERM) to its
launcher (which passes it to every worker), to itself only (the ranks agree), or a one-process run to itself,
and writes the time to OUT/signalled. ``--save-every``: 5 by default. Writes OUT/params.pt (rank 0) and
OUT/evals.rank{r}.json. ``--strategy fsdp-tp2``: FSDP(tp=2), for 4 ranks (tp2 x dp2: rank r reads the data of its
data-parallel rank r // 2).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

import torch
import torch.nn.functional as F
from torch import nn

import ringtrain as rt

STEPS, EVAL, K, MICRO, VOCAB, CONTEXT = 12, 4, 2, 4, 32, 8
TOKENS = torch.Generator().manual_seed(7)
DATA = torch.randint(0, VOCAB, (4096,), generator=TOKENS)


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.mix = nn.Sequential(nn.Linear(16 * CONTEXT, 32), nn.Tanh(), nn.Linear(32, VOCAB))

    def forward(self, x):
        return self.mix(self.emb(x).flatten(1))


def get_batch(step: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Micro-batch ``index`` of step ``step``: fixed offsets (a generator of its own), the same in any layout."""
    g = torch.Generator().manual_seed(1000 * step + index)
    ix = torch.randint(0, len(DATA) - CONTEXT - 1, (MICRO,), generator=g)
    return torch.stack([DATA[i:i + CONTEXT] for i in ix]), DATA[ix + CONTEXT]


def evaluate(model: nn.Module) -> float:
    """Random batches from the global RNG, as nanoGPT's estimate_loss draws them."""
    with torch.no_grad():
        ix = torch.randint(0, len(DATA) - CONTEXT - 1, (MICRO,))
        x, y = torch.stack([DATA[i:i + CONTEXT] for i in ix]), DATA[ix + CONTEXT]
        return F.cross_entropy(model(x), y).item()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--kill-at", type=int, default=0)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--preempt-at", type=int, default=0)
    parser.add_argument("--preempt-how", choices=["launcher", "rank1", "self"], default="launcher")
    parser.add_argument("--preempt-signal", default="SIGTERM")
    args = parser.parse_args()
    strategy = rt.strategies.FSDP(tp=2) if args.strategy == "fsdp-tp2" else args.strategy
    ring = rt.Ring(strategy, seed=0, checkpoint_dir=os.path.join(args.out, "ckpt"), save_every=args.save_every)
    data_rank, data_ranks = ring.strategy.data_parallel_rank, ring.strategy.data_parallel_size
    ring.accumulate = K * (2 // data_ranks)  # one process takes both data ranks' micro-batches
    torch.manual_seed(0)
    model = TinyLM()
    model, optimizer = ring.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    backwards, evals = 0, []
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    first_run = ring.optimizer_steps == 0  # nothing resumed
    for step in ring.steps(args.steps):
        if step % EVAL == 0:
            evals.append((step, evaluate(ring.unwrap(model) if ring.world_size == 1 else model)))
        for i in range(ring.accumulate):
            backwards += 1
            if args.kill_at and backwards == args.kill_at and ring.rank == 1 and first_attempt:
                listed = os.path.join(args.out, "ckpt", "manifest.json")  # what a restart can resume from
                with open(os.path.join(args.out, "at_kill.json"), "w") as f:
                    f.write(open(listed).read() if os.path.exists(listed) else "null")
                os.kill(os.getpid(), signal.SIGKILL)
            if args.preempt_at and backwards == args.preempt_at and first_run and ring.rank == ring.world_size - 1:
                with open(os.path.join(args.out, "signalled"), "w") as f:
                    f.write(f"{time.time()} {step}")
                target = os.getppid() if args.preempt_how == "launcher" else os.getpid()
                os.kill(target, getattr(signal, args.preempt_signal))
                waited = time.monotonic()  # until the launcher's forward reaches this rank (a few steps' time)
                while ring._held.preemption.requested is None and time.monotonic() - waited < 30:
                    time.sleep(0.01)
            x, y = get_batch(step, data_rank * ring.accumulate + i)  # one TP group: one batch
            ring.backward(F.cross_entropy(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
        evals.append((step, torch.rand(()).item()))  # a random draw right after the step
    state = ring.strategy.module_state(model)
    if ring.rank == 0:
        torch.save(state, os.path.join(args.out, "params.pt"))
    with open(os.path.join(args.out, f"evals.rank{ring.rank}.json"), "w") as f:
        json.dump(evals, f)
    ring.close()


if __name__ == "__main__":
    main()
