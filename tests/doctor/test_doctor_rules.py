"""Each rule against scripts written to fall into its trap, and their corrected twins.

``cases/<rule-id>/`` holds, per rule, traps in at least two styles (plain tutorial code;
aliases, helpers, classes, nesting) and the corrected twin of each. A trap marks every line
a finding must be reported at with ``# expect: <rule-id>``, written by hand; the test
compares the exact set of (line, rule) pairs, so a finding at the wrong line, a missing
one, or one more all fail. ``fixed_*`` and ``clean_*`` scripts must give no finding at all.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _marks import expected

from ringtrain.doctor import RULES, check_source

CASES = Path(__file__).parent / "cases"


def scripts(prefixes: tuple[str, ...]) -> list[Path]:
    return sorted(p for p in CASES.glob("*/*.py") if p.name.startswith(prefixes))


@pytest.mark.parametrize("path", scripts(("trap_",)), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_trap_is_reported_at_the_marked_lines(path):
    source = path.read_text()
    marks = expected(source)
    assert (rule := path.parent.name) in {r for _, r in marks}, f"{path} marks no {rule} finding"
    found = {(f.line, f.rule) for f in check_source(source, str(path))}
    assert found == marks


@pytest.mark.parametrize("path", scripts(("fixed_", "clean_")), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_corrected_script_is_clean(path):
    findings = check_source(path.read_text(), str(path))
    assert findings == [], "\n".join(f.text() for f in findings)


def test_every_rule_has_two_trap_styles_and_their_twins():
    for rule in RULES:
        folder = CASES / rule
        traps = sorted(p.name.removeprefix("trap_") for p in folder.glob("trap_*.py"))
        twins = sorted(p.name.removeprefix("fixed_") for p in folder.glob("fixed_*.py"))
        assert len(traps) >= 2, f"{rule}: {traps}"
        assert traps == twins, f"{rule}: every trap needs its corrected twin"


def test_findings_carry_the_rule_severity_and_a_hint():
    path = CASES / "save-every-rank" / "trap_plain.py"
    (finding,) = check_source(path.read_text(), str(path))
    assert finding.severity == RULES["save-every-rank"].severity == "warning"
    assert finding.hint and finding.message and finding.file == str(path)


def test_the_batch_size_hint_gives_an_integer():
    path = CASES / "batch-size-float" / "trap_float.py"
    (finding,) = check_source(path.read_text(), str(path))
    assert "(128 // size)" in finding.hint  # not `128 // float(size)`, a float too


def test_an_evaluation_that_may_not_be_the_last_thing_says_possible():
    folder = CASES / "eval-on-one-rank-through-ddp"
    (periodic,) = check_source((folder / "trap_periodic.py").read_text(), "trap_periodic.py")
    assert periodic.message.startswith("possible: ") and "once the loop at line 23 ends" in periodic.message
    (every_epoch,) = check_source((folder / "trap_alias.py").read_text(), "trap_alias.py")
    assert not every_epoch.message.startswith("possible")  # the last epoch's validation always runs
