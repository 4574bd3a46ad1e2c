"""examples/monai_unet3d.py: MONAI's 3D U-Net tutorial through ringtrain, on 2 CPU ranks (DDP and Horovod-style).

Needs the `monai` extra (monai, nibabel); `make install` installs it. Each job writes its
own synthetic NIfTI volumes into the test's temporary folder and trains a few seconds.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("monai", reason="monai is not installed: pip install -e '.[monai]' (make install does)")
pytest.importorskip("nibabel", reason="nibabel is not installed: pip install -e '.[monai]' (make install does)")

pytestmark = pytest.mark.timeout(150)

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "monai_unet3d.py")
EPOCHS = 6
EPOCH_LINE = re.compile(r"epoch (\d+)/\d+ \(([\d.]+) s\) loss ([\d.]+) held-out dice ([\d.]+)")


def _run(cwd: Path, *launch: str, script_args: tuple = ()) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOROVOD_")}
    env["OMP_NUM_THREADS"] = "1"
    argv = [sys.executable, "-m", "ringtrain", "run", *launch, EXAMPLE, "--epochs", str(EPOCHS), *script_args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=cwd, env=env)
    report = f"--- exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, report
    epochs = [tuple(map(float, m.groups())) for m in EPOCH_LINE.finditer(proc.stdout)]
    before = re.search(r"held-out dice before training ([\d.]+)", proc.stdout)
    assert len(epochs) == EPOCHS and before, report
    return {"out": proc.stdout, "report": report, "epochs": epochs, "before": float(before.group(1))}


@pytest.fixture(scope="module")
def ddp(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("monai-ddp")
    return {"cwd": cwd, **_run(cwd, "--nproc-per-node", "2")}


def test_ddp_on_two_ranks_learns_to_segment(ddp):
    assert "2 process(es), ddp; 16 training / 4 held-out volumes" in ddp["out"], ddp["report"]
    assert "global batch 4 = 2 per device x 2 device(s)" in ddp["out"], ddp["report"]
    losses = [e[2] for e in ddp["epochs"]]
    dice = [e[3] for e in ddp["epochs"]]
    assert losses[-1] < losses[0] - 0.1, ddp["report"]  # DiceLoss falls
    assert dice[-1] > ddp["before"] + 0.15 and dice[-1] > 0.25, ddp["report"]  # held-out Dice rises
    assert max(e[1] for e in ddp["epochs"]) < 120  # seconds per epoch (sub-second here)
    assert (ddp["cwd"] / "monai_unet3d.pt").is_file()  # saved once, by rank 0


def test_data_is_written_once_before_any_rank_lists_it(ddp):
    data = ddp["cwd"] / "monai_data"
    names = sorted(os.listdir(data))
    assert len([n for n in names if n.startswith("img")]) == len([n for n in names if n.startswith("seg")]) == 20
    assert all(n.endswith(".nii.gz") for n in names)
    assert not [n for n in os.listdir(ddp["cwd"]) if n.startswith(".monai-data-")]  # no scratch folder left
    import nibabel as nib

    img = nib.load(str(data / "img000.nii.gz"))
    assert img.shape == (32, 32, 32, 1)  # create_test_image_3d(..., channel_dim=-1), as the tutorial writes


def test_horovod_variant_trains_like_ddp(ddp, tmp_path):
    # horovodrun's form (`-np 2 python script.py`) and the script's --horovod: the optimizer averages
    # gradients instead of DDP. Same data, crops and initial weights: the same training, to float tolerance.
    hvd = _run(tmp_path, "--horovod", "-np", "2", "python", script_args=("--horovod",))
    assert "2 process(es), hvd" in hvd["out"], hvd["report"]
    assert hvd["before"] == ddp["before"]
    for (_, _, loss_h, dice_h), (_, _, loss_d, dice_d) in zip(hvd["epochs"], ddp["epochs"]):
        assert loss_h == pytest.approx(loss_d, abs=2e-3), (hvd["report"], ddp["report"])
        assert dice_h == pytest.approx(dice_d, abs=0.02), (hvd["report"], ddp["report"])
