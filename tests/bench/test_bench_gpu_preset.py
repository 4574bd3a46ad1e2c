"""`--preset gpu`: its code path on CPU ranks (tiny sizes), and the real thing where CUDA is."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from ringtrain.bench import gpu


@pytest.mark.timeout(150)
def test_preset_code_path_runs_on_cpu_ranks(tmp_path):
    # The CLI refuses --preset gpu without CUDA; the same worker code with device="cpu" checks
    # everything but the CUDA calls, so the preset does not meet its first bug on a GPU machine.
    opts = {"precisions": ["bf16-mixed"], "nprocs": [2], "repeats": 2, "warmup": 1, "batch_size": 8,
            "steps": 1, "compile": False, "data": None, "peak_tflops": 100.0, "timeout": 120, "device": "cpu",
            "images": 64, "width": 4}
    rows, meta = gpu.run_preset(opts)
    assert len(rows) == 2 * 2  # channels_last off/on x (ringtrain, raw)
    for row in rows:
        assert row["error"] is None and row["images_per_s"] > 0 and len(row["rates"]) == 2
        assert row["mfu"] > 0 and row["gpus"] == 2
    assert all(r["ratio_vs_raw"] == 1.0 for r in rows if r["impl"] == "raw")
    table = gpu.preset_table(rows, meta)
    assert "MFU" in table and "ringtrain" in table
    png = gpu.preset_png(rows, meta, str(tmp_path / "throughput.png"))
    assert open(png, "rb").read(4) == b"\x89PNG"


def _compiled_modules() -> list[str]:
    """On each rank (as preset_worker does): both --compile loops; what each compiled module wraps."""
    import os

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    loops = [gpu.Loop(impl, "bf16-mixed", True, True, torch.device("cpu"), int(os.environ["WORLD_SIZE"]), width=4)
             for impl in ("ringtrain", "raw")]
    wrapped = [type(loop.model).__name__ + "(" + type(loop.model._orig_mod).__name__ + ")" for loop in loops]
    for loop in loops:
        loop.close()
    if dist.is_initialized():
        dist.destroy_process_group()
    return wrapped


@pytest.mark.timeout(150)
def test_compile_rows_compile_the_ddp_wrapped_module_in_both_loops(run_ranks):
    # Like with like: ringtrain's row once measured DDP(compile(m)) and the raw row compile(DDP(m)).
    # Compiling is lazy, so this builds the loops only (no C++ compile on the CPU).
    for wrapped in run_ranks(_compiled_modules):
        assert wrapped == ["OptimizedModule(DistributedDataParallel)"] * 2


def test_flops_per_image_is_counted_not_guessed():
    # CIFAR ResNet-18: 0.56 G multiply-adds forward = 1.11 GFLOP; training (forward + backward) ~3x.
    assert gpu.train_flops_per_image() == pytest.approx(3.33e9, rel=0.01)
    assert gpu.peak_tflops("NVIDIA H100 80GB HBM3", None) == 989.4
    assert gpu.peak_tflops("NVIDIA H100 PCIe", None) == 756.0
    assert gpu.peak_tflops("NVIDIA A100-SXM4-80GB", None) == 312.0
    assert gpu.peak_tflops("Some GPU", 123.0) == 123.0 and gpu.peak_tflops("Some GPU", None) is None


@pytest.mark.gpu
@pytest.mark.timeout(600)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_preset_on_a_gpu(tmp_path):
    done = subprocess.run([sys.executable, "-m", "ringtrain", "bench", "--preset", "gpu", "--steps", "20",
                           "--repeats", "2", "--precision", "bf16-mixed", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=580)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "MFU" in done.stdout and (tmp_path / "results.csv").is_file()
