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


def _severities(rule: str, name: str) -> list[tuple[str, str]]:
    path = CASES / rule / name
    return [(f.severity, f.message) for f in check_source(path.read_text(), str(path)) if f.rule == rule]


def test_a_one_rank_evaluation_through_ddp_is_an_error_only_where_the_file_shows_buffers():
    # a register_buffer that always runs, BatchNorm layers (also through a helper and a class's parameter)
    for name in ("trap_plain.py", "trap_alias.py", "trap_grad.py", "trap_periodic.py", "trap_ring.py"):
        for severity, message in _severities("eval-on-one-rank-through-ddp", name):
            assert severity == "error" and "this model has buffers" in message, (name, message)
    # nanoGPT's causal mask, registered only without flash attention (torch < 2.0): the condition is said
    ((severity, message),) = _severities("eval-on-one-rank-through-ddp", "trap_flash.py")
    assert severity == "warning"
    assert "if the model has buffers" in message and "only under `if not self.flash:`" in message
    # FSDP's forward all-gathers whatever the model holds
    ((severity, _),) = _severities("eval-on-one-rank-through-ddp", "trap_fsdp.py")
    assert severity == "error"


def test_an_optimizer_left_out_of_setup_is_an_error_under_a_written_fsdp_and_a_warning_under_an_open_one():
    for name in ("trap_plain.py", "trap_alias.py"):
        assert [s for s, _ in _severities("optimizer-not-given-to-setup", name)] == ["error"]
    ((severity, message),) = _severities("optimizer-not-given-to-setup", "trap_env.py")
    assert severity == "warning" and message.startswith("under FSDP — the strategy here is Ring(os.environ.get(")


def test_the_resume_rules_say_they_matter_when_a_run_resumes():
    for rule in ("prefetched-batch", "loader-position-not-kept"):
        for name in sorted(p.name for p in (CASES / rule).glob("trap_*.py")):
            for severity, message in _severities(rule, name):
                assert severity == "warning" and "when the run resumes from a checkpoint" in message, (name, message)


def test_backward_without_ring_names_what_the_ring_does():
    ((_, accumulate),) = _severities("backward-without-ring", "trap_plain.py")
    assert "Ring(accumulate=4), line 8" in accumulate and "on every batch" in accumulate
    ((_, fp16),) = _severities("backward-without-ring", "trap_fp16.py")
    assert "float16 wherever dtype is \"float16\"" in fp16 and "second time" in fp16


def test_a_finding_can_only_take_its_rule_s_lesser_severity(monkeypatch):
    from ringtrain.doctor import check as check_module

    def rated(script):
        yield script.tree.body[0], "message", "hint", "note"

    monkeypatch.setitem(check_module.CHECKS, "optimizer-not-given-to-setup", rated)
    with pytest.raises(ValueError, match="lesser severity 'warning'"):
        check_source("x = 1\n")
