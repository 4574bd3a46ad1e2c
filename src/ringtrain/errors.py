"""The one error type users see, and how it is worded.

Every user-facing error says what was asked, what was found, and ends with
``HINT: <what to do>`` (DESIGN.md, principle 4).
"""

from __future__ import annotations


class RingtrainError(RuntimeError):
    """A mistake in how ringtrain was asked to run, with the fix in ``hint``."""

    def __init__(self, message: str, hint: str):
        self.message = message
        self.hint = hint
        super().__init__(f"{message}\nHINT: {hint}")
