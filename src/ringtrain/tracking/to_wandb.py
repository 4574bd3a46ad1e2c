"""Weights & Biases, through ``wandb.init`` / ``run.log`` (online, or ``WANDB_MODE=offline`` for ``wandb sync``).

The run's files go under the run folder (``RUN_DIR/wandb``) and its id is kept there, so a restarted job
continues the same W&B run (``resume="allow"``). W&B accepts only steps above the last one it has:
after a restart it drops the values of the steps the job does again (it says so in its own warning);
metrics.csv and TensorBoard have every step once. ``WANDB_PROJECT`` and W&B's other variables apply.
"""

from __future__ import annotations

import os
import uuid

from .adapter import Adapter


class WandB(Adapter):
    def __init__(self, folder: str, resume_step: int | None):
        import wandb

        id_file = os.path.join(folder, "wandb-run-id")
        if os.path.exists(id_file):
            with open(id_file) as f:
                run_id = f.read().strip()
        else:
            run_id = uuid.uuid4().hex[:8]  # W&B run ids: lowercase letters and digits
            with open(id_file, "w") as f:
                f.write(run_id)
        self.run = wandb.init(dir=folder, id=run_id, resume="allow", name=os.path.basename(os.path.abspath(folder)),
                              project=os.environ.get("WANDB_PROJECT", "ringtrain"))

    def write(self, step: int, values: dict[str, float], wall_time: float) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


ADAPTER = WandB
