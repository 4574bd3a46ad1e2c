"""TensorBoard, through PyTorch's ``SummaryWriter`` (it writes TensorBoard's own event files).

A restarted run opens the writer with ``purge_step`` = the step after the one it resumed from:
TensorBoard then discards the events the cut-off run wrote past it, so a curve has no doubled steps.
"""

from __future__ import annotations

from .adapter import Adapter


class TensorBoard(Adapter):
    def __init__(self, folder: str, resume_step: int | None):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=folder, purge_step=None if resume_step is None else resume_step + 1)

    def write(self, step: int, values: dict[str, float], wall_time: float) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, global_step=step, walltime=wall_time)
        self.writer.flush()  # at the user's logging frequency: a kill loses nothing already logged

    def close(self) -> None:
        self.writer.close()


ADAPTER = TensorBoard
