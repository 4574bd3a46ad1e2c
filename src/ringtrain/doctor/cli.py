"""ringtrain doctor: read PyTorch distributed training scripts and name the traps they fall into.

Usage
-----

    ringtrain doctor [options] PATH [PATH ...]

Each PATH is a Python file or a folder (searched for ``*.py``, skipping hidden folders,
``__pycache__`` and virtual environments); ``-`` reads one script from standard input.
The scripts are parsed with Python's ``ast``, never imported or run: the check is safe on
code you do not trust, needs no GPU, and takes well under a second for a 1,000-line script. It follows the script's own
names — ``import torch.distributed as D``, ``from torch.nn.parallel import
DistributedDataParallel as DDP``, ``nn.parallel.DistributedDataParallel``, ``DS =
DistributedSampler``, plain assignments, loop names and function parameters — and reports
only what it can justify; findings that rest on a heuristic say "possible".

Examples
--------

    ringtrain doctor train.py
    ringtrain doctor src/ scripts/train_ddp.py
    ringtrain doctor --format json train.py > findings.json
    ringtrain doctor --ignore hvd-lr-scale,dataparallel-batch train.py
    xclip -o | ringtrain doctor -          # a snippet copied from a blog post

Output
------

One finding per entry, then a summary line::

    train.py:42: sampler-set-epoch: warning: `train_loader` draws from a DistributedSampler ...
        HINT: call train_sampler.set_epoch(epoch) at the top of the epoch loop ...
    1 file checked: 1 finding (0 errors, 1 warning, 0 notes)

``--format json`` prints a JSON list instead (the summary goes to standard error), one
object per finding with ``file``, ``line``, ``rule``, ``message``, ``hint`` and ``severity``.

Severities: ``error`` — the script crashes or hangs; ``warning`` — it runs but trains,
saves or reports wrongly, or slower than it should; ``note`` — a fact about its semantics
worth knowing (DataParallel's batch size, Horovod's learning-rate scaling, FSDP1). Two rules
rate a finding one step lower, as a warning whose message names the condition, when the file
leaves that condition open (eval-on-one-rank-through-ddp, optimizer-not-given-to-setup).

Rules
-----

Each finding is reported at the line to change; ``--list-rules`` prints this list briefly.

    sampler-set-epoch         warning  at the epoch loop's `for`: a shuffling DistributedSampler drives
                                       the training loader and the loop never calls set_epoch, so
                                       every epoch sees the same order
    save-every-rank           warning  at torch.save, in a multi-process script, not under a rank-0
                                       check (`rank == 0`, `get_rank() == 0`, `local_rank in (-1, 0)`,
                                       `is_main_process()`, an early `return` on other ranks...)
    local-rank-arg            error    at add_argument('--local_rank') when '--local-rank' is not declared:
                                       torch >= 2.0's launcher passes --local-rank=N ("unrecognized
                                       arguments"); torchrun passes nothing (scripts using mp.spawn are
                                       left alone: nobody sends them the flag)
    ddp-before-to             error    at DistributedDataParallel(model, device_ids=...) (or under NCCL)
                                       while the model is provably still on the CPU
    shuffle-with-sampler      error    at DataLoader(shuffle=True, sampler=...): ValueError at run time
    eval-sampler-padding      warning  at a DistributedSampler without drop_last on an evaluation set
                                       whose metrics are reduced: padded duplicates are counted (possible:
                                       not when the set divides evenly)
    accumulate-no-sync        warning  at backward(): it runs every micro-batch, the optimizer steps
                                       every k (`if (i + 1) % k == 0`), under DDP, with no no_sync()
                                       anywhere: every micro-batch all-reduces
    load-map-location         warning  at torch.load without map_location whose result goes to
                                       load_state_dict, in a multi-process CUDA script: every rank
                                       loads the checkpoint onto the GPU it was saved from
    syncbn-after-ddp          warning  at convert_sync_batchnorm applied after the DDP wrap
    set-device                warning  at init_process_group('nccl') (or hvd.init) in a CUDA script that
                                       never calls torch.cuda.set_device: every current device is cuda:0
    nccl-without-cuda         error    at init_process_group('nccl') in a script that never uses CUDA but
                                       wraps DDP or calls collectives
    rank-from-local-rank      warning  at init_process_group(rank=local_rank): possible: right on one
                                       machine, but on two nodes both claim ranks 0..n-1 (not under mp.spawn)
    collective-on-one-rank    error    at all_reduce/reduce/gather/broadcast... reached only under a
                                       rank-0 check: the other ranks never join, the job hangs
    unreduced-metric          warning  at the print: possible: an evaluation metric of one rank's shard,
                                       in a script that never reduces anything across ranks
    batch-size-float          error    at DataLoader(batch_size=batch_size / nprocs): a float, ValueError
    sampler-dataset-mismatch  error    at DataLoader(train_set, sampler=DistributedSampler(test_set))
    hvd-broadcast             warning  at hvd.DistributedOptimizer with no hvd.broadcast_parameters, no
                                       common seed and no elastic sync (@hvd.elastic.run, state.sync()):
                                       every rank starts from its own weights
    hvd-lr-scale              note     at the optimizer: the Horovod learning rate is never multiplied by
                                       hvd.size() (and the global batch is not kept fixed either)
    dataparallel-batch        note     at nn.DataParallel: its batch_size is global; DDP's is per process
    optimizer-before-shard    error    at the optimizer: built on the model's parameters before fully_shard
                                       (or FullyShardedDataParallel without use_orig_params=True) replaces
                                       them: it updates tensors the model no longer uses
    sharded-state-on-one-rank error    at model.state_dict() / get_model_state_dict / FSDP.optim_state_dict
                                       of a sharded model, only under a rank-0 check: gathering is a
                                       collective (a hang), and FSDP2's sharded state saved there is 1/world
    save-sharded-every-rank   error    at torch.save on every rank, to one path, of FSDP2 DTensor shards (or
                                       a full_state_dict + cpu_offload state, empty off rank 0): each rank
                                       overwrites the file with its own piece (save-every-rank then stays quiet)
    fsdp1-api                 note     at the first FullyShardedDataParallel (or FSDP1 config): torch's docs
                                       recommend FSDP2's fully_shard and give a migration guide
    unseeded-split            warning  at random_split (or a torch.randperm / np.random.permutation /
                                       random.shuffle whose indices go to Subset or are sliced by rank)
                                       with no generator or seed shared by the ranks: each rank splits
                                       the data differently
    model-not-wrapped         warning  at an `if` on the device (`if use_cuda:`, `device.type == "cuda"`)
                                       whose other side wraps in DDP/FSDP/hvd.DistributedOptimizer: on
                                       this side the group forms and a DistributedSampler shards, but
                                       each rank trains its own model
    ranks-share-device        warning  at `(rank * k + i) % world_size` used as a device (k >= 2): k devices
                                       per rank folded onto world_size GPUs, so two ranks share one
    eval-on-one-rank-through-ddp
                              error    at model(x) reached only under a rank-0 check while model is the
                                       DistributedDataParallel wrapper (not model.module): DDP's forward
                                       broadcasts the buffers from rank 0 (every forward with gradients
                                       on; the first after a training step under no_grad), and the other
                                       ranks may next reach a collective or the end; an FSDP model's
                                       forward all-gathers, always a hang. A warning, saying "if the model
                                       has buffers", where the file does not show BatchNorm or a
                                       register_buffer that always runs (nanoGPT's mask: only without flash)
    loss-divided-with-ring-accumulate
                              warning  at `loss = loss / k` (or `loss /= k`, `ring.backward(loss / k)`)
                                       reaching ring.backward in a script whose Ring accumulates
                                       (accumulate=k, ring.accumulate = k, global_batch=): ring.backward
                                       divides too, so the gradients are k times too small
    backward-without-ring     error    at loss.backward() (or scaler.scale(loss).backward()) followed by a
                                       step of the optimizer ring.setup wraps, where the Ring accumulates
                                       (accumulate=k not 1, global_batch=, ring.accumulate = k: it steps on
                                       every batch) or runs float16 (precision='16-mixed'/'fp16'/'float16':
                                       its GradScaler unscales gradients it never scaled); ring.backward(loss)
    optimizer-not-given-to-setup
                              error    at `model = ring.setup(model)` when an optimizer built on the model's
                                       parameters before it (torch.optim, model.configure_optimizers) is
                                       stepped but not given: under FSDP setup shards the parameters and the
                                       optimizer trains nothing. A warning ("under FSDP ...") when the
                                       strategy comes from the environment or an argument
    ring-save-on-one-rank     error    at ring.save / ring.load under a rank-0 check (`if ring.is_main:`,
                                       `ring.rank == 0`, `is_local_main`, a master_process flag, a helper
                                       called so, an early return): every rank must call them, rank 0 waits
                                       for the others, a hang
    prefetched-batch          warning  at the draw inside a ring.steps loop (or a while loop, with a Ring
                                       checkpoint_dir) of a batch drawn before the loop and again after the
                                       forward (nanoGPT's prefetch): when the run resumes from a checkpoint,
                                       its first step trains another batch; get_batch = ring.batches(get_batch)
    loader-position-not-kept  warning  at the construction of a loader of the script's own class (next_batch
                                       advancing current_position / current_shard...: DataLoaderLite) never
                                       given to ring.keep, in a script whose Ring checkpoints: when the run
                                       resumes, its data starts again from the beginning; ring.keep(loader)

What it cannot see
------------------

Only the files given: a helper imported from another module (``utils.init_distributed_mode``)
is a closed box, and a rule that would need to look inside it stays silent. Rules report
what the script shows, never what it might do; when the code leaves a doubt (a model built
by a factory it cannot read, a checkpoint written elsewhere) there is no finding. The aim
is no finding at all on a correct script.

Ignoring a finding
------------------

For a deliberate choice, put ``# ringtrain: ignore[rule-id]`` (several ids separated by
commas; a bare ``# ringtrain: ignore`` silences every rule) on the reported line — any
line of a call written over several lines, or the header line of a loop. ``--ignore
RULE[,RULE...]`` (repeatable) turns rules off for the whole run.

Exit status
-----------

0 no findings; 1 at least one finding (of any severity); 2 a usage error: a path that
does not exist, a file that is not Python (not ``*.py``, or not valid Python syntax: the
message gives the line), a folder with no Python file, an unknown rule id. Findings in the
other files are still printed when one file cannot be read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter

from ..errors import HintingParser, RingtrainError
from .check import check_source
from .findings import RULES, SEVERITIES, Finding

SKIP_DIRS = {"__pycache__", "site-packages", "node_modules"}


def build_parser() -> argparse.ArgumentParser:
    summary, _, manual = __doc__.partition("\n\n")
    parser = HintingParser(
        prog="ringtrain doctor",
        usage="%(prog)s [options] PATH [PATH ...]",
        description=summary.replace("ringtrain doctor: ", "", 1),
        epilog=manual,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("paths", nargs="*", metavar="PATH", help="Python files or folders; '-' reads standard input")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")
    parser.add_argument("--ignore", action="append", default=[], metavar="RULE[,RULE...]",
                        help="turn these rules off (repeatable)")
    parser.add_argument("--list-rules", action="store_true", help="print every rule id with its severity and exit")
    return parser


def python_files(path: str) -> list[str]:
    """The Python files a PATH argument names; RingtrainError when it names none."""
    if path == "-":
        return [path]
    if os.path.isdir(path):
        found = []
        for root, dirs, files in os.walk(path):
            # a virtual environment (it has a pyvenv.cfg) holds installed packages, not the user's scripts
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS
                             and not os.path.exists(os.path.join(root, d, "pyvenv.cfg")))
            found += [os.path.join(root, f) for f in sorted(files) if f.endswith(".py")]
        if not found:
            raise RingtrainError(f"{path} is a folder with no Python file in it",
                                 "name the training script itself, or a folder that holds .py files.")
        return found
    if not os.path.exists(path):
        raise RingtrainError(f"{path}: no such file or folder",
                             f"check the path (relative to the current folder, {os.getcwd()}).")
    if not path.endswith((".py", ".pyw")) and not _python_shebang(path):
        raise RingtrainError(f"{path} is not a Python file (doctor reads *.py files)",
                             "pass the training script (train.py) or a folder; for a notebook, "
                             "`jupyter nbconvert --to script notebook.ipynb` first.")
    return [path]


def _python_shebang(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            first = f.readline(200)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise RingtrainError(f"cannot read {path}: {e.strerror}", "check the file's permissions.") from e
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise RingtrainError(f"{path} is not UTF-8 text (byte {e.start}): not a Python source file",
                             "pass the .py source of the training script.") from e


def check_file(path: str, ignore: frozenset[str]) -> list[Finding]:
    shown = "<stdin>" if path == "-" else path
    source = read(path)
    try:
        return check_source(source, shown, ignore)
    except SyntaxError as e:
        where = f"{shown}:{e.lineno}" if e.lineno else shown
        raise RingtrainError(f"{where}: not valid Python ({e.msg}); doctor reads source code, it cannot check it",
                             "fix the syntax first (`python -m py_compile FILE` shows the same error); a snippet "
                             "copied from a blog post may have lost its line breaks or hold placeholders "
                             "like `rank=,`.") from e


def _ignored(values: list[str]) -> frozenset[str]:
    ids = {v.strip() for value in values for v in value.split(",") if v.strip()}
    unknown = sorted(ids - set(RULES))
    if unknown:
        raise RingtrainError(f"--ignore got unknown rule id(s): {', '.join(unknown)}",
                             f"use ids from `ringtrain doctor --list-rules`: {', '.join(RULES)}.")
    return frozenset(ids)


def summary(findings: list[Finding], files: int, unreadable: int = 0) -> str:
    counts = Counter(f.severity for f in findings)
    checked = f"{files} file{'s' if files != 1 else ''} checked"
    if unreadable:
        checked += f", {unreadable} not (see above)"
    if not findings:
        return f"{checked}: no findings"
    parts = ", ".join(f"{counts[s]} {s}{'s' if counts[s] != 1 else ''}" for s in SEVERITIES)
    return f"{checked}: {len(findings)} finding{'s' if len(findings) != 1 else ''} ({parts})"


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # `ringtrain doctor src/ | head`: the reader left; say nothing more, like other tools.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _main(argv: list[str] | None) -> int:
    ns = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if ns.list_rules:
        for rule in RULES.values():
            print(f"{rule.id:26} {rule.severity:8} {rule.summary}")
        return 0
    if not ns.paths:
        print("ringtrain doctor: no PATH given\nHINT: name the training script: `ringtrain doctor train.py` "
              "(or a folder, or - for standard input).", file=sys.stderr)
        return 2
    status = 0
    try:
        ignore = _ignored(ns.ignore)
    except RingtrainError as e:
        print(f"ringtrain doctor: {e}", file=sys.stderr)
        return 2
    findings: list[Finding] = []
    checked = unreadable = 0
    for path in ns.paths:
        try:
            files = python_files(path)
        except RingtrainError as e:
            print(f"ringtrain doctor: {e}", file=sys.stderr)
            status = 2
            continue
        for file in files:
            try:
                found = check_file(file, ignore)
            except RingtrainError as e:
                print(f"ringtrain doctor: {e}", file=sys.stderr)
                status = 2
                unreadable += 1
                continue
            checked += 1
            findings += found
            if ns.format == "text":
                for finding in found:
                    print(finding.text())
    if not checked:
        return status  # every PATH was an error (2), already said: no "0 files checked: no findings" under it
    if ns.format == "json":
        print(json.dumps([f.to_json() for f in findings], indent=2, ensure_ascii=False))
        print(summary(findings, checked, unreadable), file=sys.stderr)
    else:
        print(summary(findings, checked, unreadable))
    if status:
        return status
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
