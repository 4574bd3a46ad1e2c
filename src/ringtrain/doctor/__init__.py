"""`ringtrain doctor`: read a plain PyTorch distributed script and name the traps it falls into.

Static analysis with Python's ``ast``: the script is parsed, never imported or run. Each
rule follows the script's own names (import aliases, plain assignments, loop names,
function parameters) and reports only what it can justify; heuristic findings say
"possible". ``check_source(text, path)`` returns the findings for one script;
``ringtrain doctor PATH...`` is the command (see ``doctor/cli.py`` for its manual).

Nothing here imports torch: the rules read text.
"""

from .check import check_source
from .findings import RULES, SEVERITIES, Finding, Rule

__all__ = ["RULES", "SEVERITIES", "Finding", "Rule", "check_source"]
