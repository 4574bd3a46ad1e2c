"""What a DDP comm hook all-reduced: bytes in the step under way, in the last complete step, in all."""

from __future__ import annotations


class Traffic:
    """Counters a hook bumps per all-reduce (``sent``) and per step's last bucket (``step_done``)."""

    def __init__(self) -> None:
        self.sent = self.sent_last_step = self.total = self.calls = 0

    def count(self, nbytes: int) -> None:
        self.sent += nbytes
        self.total += nbytes
        self.calls += 1

    def step_done(self) -> None:
        self.sent_last_step, self.sent = self.sent, 0
