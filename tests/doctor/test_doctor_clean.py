"""No finding on correct scripts: every file of examples/, the ringtrain versions of the seed
tutorials (tests/seeds/*_ring.py), and reference scripts written in the shapes people copy
(PyTorch's DDP tutorial series, the ImageNet example, Horovod's recipe, accumulation with no_sync,
FSDP2 as pytorch/examples shards). Each reference script, and an example for the rules about
ringtrain's own API, is also broken on purpose, one line at a time, to show the rules do look at it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ringtrain.doctor import check_source

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = Path(__file__).parent / "reference"
EXAMPLES = sorted((ROOT / "examples").rglob("*.py"))
RING_SEEDS = sorted((ROOT / "tests" / "seeds").glob("*_ring.py"))


def findings_text(findings) -> str:
    return "\n".join(f.text() for f in findings)


def test_there_are_examples_to_check():
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_clean(path):
    findings = check_source(path.read_text(), str(path))
    assert findings == [], findings_text(findings)


@pytest.mark.parametrize("path", RING_SEEDS, ids=lambda p: p.name)
def test_ringtrain_versions_of_the_seeds_are_clean(path):
    findings = check_source(path.read_text(), str(path))
    assert findings == [], findings_text(findings)


@pytest.mark.parametrize("path", sorted(REFERENCE.glob("*.py")), ids=lambda p: p.name)
def test_reference_scripts_are_clean(path):
    findings = check_source(path.read_text(), str(path))
    assert findings == [], findings_text(findings)


_SHARDING = ("    for layer in model.layers:\n        fully_shard(layer, **fsdp_kwargs)\n"
             "    fully_shard(model, **fsdp_kwargs)\n")
_OPTIMIZER = "    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)\n"
_REST = ("    model.to_empty(device=device)\n    for module in model.modules():\n"
         "        if hasattr(module, \"reset_parameters\"):\n            module.reset_parameters()\n\n")
_SHARD_THEN_OPTIMIZER = _SHARDING + _REST + _OPTIMIZER
_OPTIMIZER_THEN_SHARD = _OPTIMIZER + _SHARDING + _REST


@pytest.mark.parametrize(
    "name, correct, broken, rule",
    [
        ("torchrun_trainer.py", "        self.train_data.sampler.set_epoch(epoch)\n", "", "sampler-set-epoch"),
        ("torchrun_trainer.py", 'map_location=f"cuda:{self.gpu_id}"', "weights_only=True", "load-map-location"),
        ("torchrun_trainer.py", "if self.gpu_id == 0 and epoch", "if epoch", "save-every-rank"),
        ("spawn_imagenet_style.py", "shuffle=False, drop_last=True", "shuffle=False", "eval-sampler-padding"),
        ("spawn_imagenet_style.py", "shuffle=(train_sampler is None)", "shuffle=True", "shuffle-with-sampler"),
        ("spawn_imagenet_style.py", "    elif args.distributed:\n        model.cuda()\n",
         "    elif args.distributed and torch.cuda.is_available():\n        model.cuda()\n", "model-not-wrapped"),
        ("horovod_exact_eval.py", "hvd.broadcast_parameters(model.state_dict(), root_rank=0)\n", "", "hvd-broadcast"),
        ("horovod_exact_eval.py", "torch.cuda.set_device(hvd.local_rank())\n", "", "set-device"),
        ("horovod_exact_eval.py", "lr=args.lr * hvd.size()", "lr=args.lr", "hvd-lr-scale"),
        ("accumulate_amp_syncbn.py", "contextlib.nullcontext() if boundary else model.no_sync()",
         "contextlib.nullcontext()", "accumulate-no-sync"),
        ("accumulate_amp_syncbn.py", "        dist.all_reduce(stats)\n        if dist.get_rank() == 0:\n",
         "        if dist.get_rank() == 0:\n            dist.all_reduce(stats)\n", "collective-on-one-rank"),
        ("fsdp2_train.py", _SHARD_THEN_OPTIMIZER, _OPTIMIZER_THEN_SHARD, "optimizer-before-shard"),
        ("fsdp2_train.py", "        model_state = self._full_model_state(model)\n",
         "        model_state = self._full_model_state(model) if dist.get_rank() == 0 else None\n",
         "sharded-state-on-one-rank"),
        ("fsdp2_train.py", "        dcp.save(state, checkpoint_id=", "        torch.save(state, ", "save-sharded-every-rank"),
        ("spawn_imagenet_style.py", "        acc1 = validate(val_loader, model, args)\n",
         "        acc1 = 0.0\n        if args.rank == 0:\n            acc1 = validate(val_loader, model, args)\n",
         "eval-on-one-rank-through-ddp"),
        ("gpt_resumable.py", "get_batch = ring.batches(get_batch)\n", "", "prefetched-batch"),
        ("gpt_resumable.py", "ring.keep(train_loader)\n", "", "loader-position-not-kept"),
        ("gpt_resumable.py", "model, optimizer = ring.setup(model, optimizer)", "model = ring.setup(model)",
         "optimizer-not-given-to-setup"),
        ("gpt_resumable.py", "        ring.backward(loss)\n", "        loss.backward()\n", "backward-without-ring"),
        ("gpt_resumable.py", 'ring.save(os.path.join(out_dir, "final.pt")',
         'if master_process:\n    ring.save(os.path.join(out_dir, "final.pt")', "ring-save-on-one-rank"),
    ],
)
def test_breaking_a_reference_script_is_noticed(name, correct, broken, rule):
    source = (REFERENCE / name).read_text()
    assert source.count(correct) == 1, f"{name} no longer contains {correct!r}"
    findings = check_source(source.replace(correct, broken), name)
    assert rule in {f.rule for f in findings}, findings_text(findings)


@pytest.mark.parametrize(
    "name, correct, broken, rule",
    [
        ("03_accumulate_amp_syncbn.py", "            ring.backward(loss)\n",
         "            ring.backward(loss / args.accumulate)\n", "loss-divided-with-ring-accumulate"),
        ("cifar_resnet.py", "        with torch.no_grad():\n            for x, y in test:\n"
                            "                correct += (model(x).argmax(1) == y).sum()\n",
         # Rank 0 alone, with gradients on (the no_grad dropped): ringtrain's DDP broadcasts the buffers then.
         "        if ring.is_main:\n            for x, y in test:\n"
         "                correct += (model(x).argmax(1) == y).sum()\n", "eval-on-one-rank-through-ddp"),
    ],
)
def test_breaking_an_example_is_noticed(name, correct, broken, rule):
    source = (ROOT / "examples" / name).read_text()
    assert source.count(correct) == 1, f"{name} no longer contains {correct!r}"
    findings = check_source(source.replace(correct, broken), name)
    assert rule in {f.rule for f in findings}, findings_text(findings)


def test_the_converted_gpt_script_gets_both_resume_rules_without_the_two_lines_and_neither_with_them():
    source = (REFERENCE / "gpt_resumable.py").read_text()
    bare = source.replace("get_batch = ring.batches(get_batch)\n", "").replace("ring.keep(train_loader)\n", "")
    assert {f.rule for f in check_source(bare, "bare.py")} == {"prefetched-batch", "loader-position-not-kept"}
    assert check_source(source, "gpt_resumable.py") == []


def _python_files_to_survive() -> list[Path]:
    ours = [p for folder in ("src", "tests", "examples", "benchmarks") for p in (ROOT / folder).rglob("*.py")]
    stdlib = Path(ast.__file__).parent
    theirs = sorted(stdlib.glob("*.py"))[:60]  # varied real code: match, walrus, async, decorators...
    return ours + theirs


def test_any_valid_python_is_read_without_crashing():
    checked = 0
    for path in _python_files_to_survive():
        source = path.read_text(encoding="utf-8", errors="replace")
        try:
            compile(source, str(path), "exec", flags=ast.PyCF_ONLY_AST)
        except SyntaxError:
            continue
        check_source(source, str(path))  # findings or not, never an exception
        checked += 1
    assert checked > 100
