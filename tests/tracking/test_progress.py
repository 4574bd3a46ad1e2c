"""The progress bar shows the values ring.log logged last (issue 22)."""

from __future__ import annotations

import torch

from ringtrain.loop.progress import Progress


def run_bar(logged: dict[str, float]) -> None:
    for _ in Progress(range(3), enabled=True, world_size=2, last_loss=lambda: torch.tensor(9.0), refresh=0.0,
                      logged=lambda: logged):
        pass


def test_bar_shows_logged_values_instead_of_this_ranks_loss(capsys):
    run_bar({})
    assert "loss=9.0000" in capsys.readouterr().err  # nothing logged: this rank's last loss
    run_bar({"loss": 0.25, "acc": 0.875})
    shown = capsys.readouterr().err
    assert "loss=0.25" in shown and "acc=0.875" in shown and "9.0000" not in shown  # the whole job's, as logged
