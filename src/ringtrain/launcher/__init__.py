"""Starting processes: ``ringtrain run`` (a torchrun wrapper: run.py's manual, plan.py, agent.py) and ``launch()``.

Named ``launcher``, not ``launch``: ``ringtrain.launch`` is the public function, and a subpackage
of the same name would be hidden behind it.

Importing this package stays cheap: torch is imported by the functions that need it.
"""

from .spawn import launch, spawn

__all__ = ["launch", "spawn"]
