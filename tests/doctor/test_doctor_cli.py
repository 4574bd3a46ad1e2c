"""`ringtrain doctor` as a command: output formats, exit status, ignoring, usage errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ringtrain.doctor import RULES
from ringtrain.doctor import cli as doctor
from ringtrain import cli

CASES = Path(__file__).parent / "cases"
TRAP = CASES / "save-every-rank" / "trap_plain.py"  # one finding, at line 15
CLEAN = CASES / "save-every-rank" / "fixed_plain.py"

SAVE_ON_EVERY_RANK = """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
torch.save({"w": 1}, "ckpt.pt")
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def binary(path: Path) -> Path:
    path.write_bytes(b"\xff\xfe\x00x")
    return path


def folder(path: Path) -> Path:
    path.mkdir()
    return path


def test_a_clean_script_exits_0(capsys):
    assert doctor.main([str(CLEAN)]) == 0
    assert capsys.readouterr().out.strip() == "1 file checked: no findings"


def test_text_output_is_path_line_rule_then_hint_then_summary(capsys):
    assert doctor.main([str(TRAP)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{TRAP}:15: save-every-rank: warning: torch.save runs on every rank")
    assert lines[1].startswith("    HINT: ") and "ring.save" in lines[1]
    assert lines[-1] == "1 file checked: 1 finding (0 errors, 1 warning, 0 notes)"


def test_json_is_a_list_of_findings_on_stdout_alone(capsys):
    assert doctor.main(["--format", "json", str(TRAP), str(CLEAN)]) == 1
    captured = capsys.readouterr()
    findings = json.loads(captured.out)
    assert findings == [{
        "file": str(TRAP), "line": 15, "rule": "save-every-rank", "severity": "warning",
        "message": findings[0]["message"], "hint": findings[0]["hint"],
    }]
    assert findings[0]["message"] and findings[0]["hint"]
    assert "2 files checked: 1 finding" in captured.err


def test_json_with_no_findings_is_an_empty_list(capsys):
    assert doctor.main(["--format", "json", str(CLEAN)]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_ignore_flag_turns_rules_off(capsys):
    assert doctor.main(["--ignore", "save-every-rank", str(TRAP)]) == 0
    assert doctor.main(["--ignore", "hvd-lr-scale,save-every-rank", str(TRAP)]) == 0
    assert doctor.main(["--ignore", "hvd-lr-scale", "--ignore", "save-every-rank", str(TRAP)]) == 0
    assert doctor.main(["--ignore", "hvd-lr-scale", str(TRAP)]) == 1


@pytest.mark.parametrize(
    "comment, silenced",
    [
        ("# ringtrain: ignore[save-every-rank]", True),
        ("# ringtrain: ignore[hvd-lr-scale, save-every-rank]", True),
        ("# ringtrain: ignore", True),
        ("# ringtrain: ignore[local-rank-arg]", False),
        ("# ringtrain ignore[save-every-rank]", False),  # not the marker
    ],
)
def test_ignore_comments_on_the_reported_line(tmp_path, capsys, comment, silenced):
    lines = SAVE_ON_EVERY_RANK.splitlines()
    lines[4] += "  " + comment
    script = write(tmp_path / "train.py", "\n".join(lines) + "\n")
    assert doctor.main([str(script)]) == (0 if silenced else 1)


def test_an_ignore_comment_anywhere_in_a_multiline_call_counts_but_not_in_a_string(tmp_path, capsys):
    spread = SAVE_ON_EVERY_RANK.replace(
        'torch.save({"w": 1}, "ckpt.pt")',
        'torch.save(\n    {"w": 1},\n    "ckpt.pt",  # ringtrain: ignore[save-every-rank]\n)')
    assert doctor.main([str(write(tmp_path / "a.py", spread))]) == 0
    in_string = SAVE_ON_EVERY_RANK.replace('"ckpt.pt"', '"# ringtrain: ignore[save-every-rank]"')
    assert doctor.main([str(write(tmp_path / "b.py", in_string))]) == 1


def test_folders_are_searched_for_python_files_skipping_hidden_and_virtual_environments(tmp_path, capsys):
    write(tmp_path / "proj" / "train.py", SAVE_ON_EVERY_RANK)
    write(tmp_path / "proj" / "sub" / "eval.py", SAVE_ON_EVERY_RANK)
    write(tmp_path / "proj" / "notes.md", "not python")
    write(tmp_path / "proj" / ".hidden" / "x.py", SAVE_ON_EVERY_RANK)
    write(tmp_path / "proj" / "venv" / "pyvenv.cfg", "home = /usr/bin")
    write(tmp_path / "proj" / "venv" / "lib" / "y.py", SAVE_ON_EVERY_RANK)
    assert doctor.main(["--format", "json", str(tmp_path / "proj")]) == 1
    files = sorted(Path(f["file"]).relative_to(tmp_path / "proj").as_posix()
                   for f in json.loads(capsys.readouterr().out))
    assert files == ["sub/eval.py", "train.py"]


def test_standard_input(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", __import__("io").StringIO(SAVE_ON_EVERY_RANK))
    assert doctor.main(["-"]) == 1
    assert capsys.readouterr().out.startswith("<stdin>:5: save-every-rank:")


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda d: d / "missing.py", "no such file or folder"),
        (lambda d: write(d / "README.md", "# hello\n"), "is not a Python file"),
        (lambda d: write(d / "broken.py", "import torch\nx = (1,\n"), "broken.py:2: not valid Python"),
        (lambda d: binary(d / "binary.py"), "is not UTF-8 text"),
        (lambda d: folder(d / "empty"), "no Python file in it"),
    ],
)
def test_usage_errors_exit_2_with_a_hint(tmp_path, capsys, make, needle):
    path = make(tmp_path)
    assert doctor.main([str(path)]) == 2
    captured = capsys.readouterr()
    assert needle in captured.err and "HINT:" in captured.err, captured.err
    assert captured.out == "", captured.out  # only the error: no "0 files checked: no findings" under it
    assert doctor.main(["--format", "json", str(path)]) == 2
    assert capsys.readouterr().out == ""


def test_a_bad_file_does_not_hide_the_findings_of_the_others(tmp_path, capsys):
    broken = write(tmp_path / "broken.py", "def f(:\n")
    assert doctor.main([str(broken), str(TRAP)]) == 2
    captured = capsys.readouterr()
    assert f"{TRAP}:15: save-every-rank" in captured.out
    assert "1 file checked, 1 not (see above): 1 finding" in captured.out
    assert "broken.py:1: not valid Python" in captured.err


def test_unknown_rule_and_no_path_are_usage_errors(capsys):
    assert doctor.main(["--ignore", "set-epoch", str(TRAP)]) == 2
    assert "unknown rule id(s): set-epoch" in capsys.readouterr().err
    assert doctor.main([]) == 2
    assert "HINT:" in capsys.readouterr().err


def test_help_is_the_manual_and_names_every_rule(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["doctor", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for section in ("Usage", "Examples", "Output", "Rules", "Ignoring a finding", "Exit status"):
        assert section in out
    for rule in RULES:
        assert rule in out, rule


def test_list_rules(capsys):
    assert doctor.main(["--list-rules"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out] == list(RULES)
    assert [line.split()[1] for line in out] == [r.severity for r in RULES.values()]


def test_the_dispatcher_knows_doctor(capsys):
    assert cli.main(["--help"]) == 0
    assert "doctor" in capsys.readouterr().out
    assert cli.main(["doctor", str(TRAP)]) == 1


@pytest.mark.timeout(120)
def test_the_console_command(tmp_path):
    script = write(tmp_path / "train.py", SAVE_ON_EVERY_RANK)
    ringtrain = Path(sys.executable).parent / "ringtrain"
    command = [str(ringtrain)] if ringtrain.exists() else [sys.executable, "-m", "ringtrain"]
    proc = subprocess.run([*command, "doctor", str(script)], capture_output=True, text=True, timeout=100,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 1, proc.stderr
    assert f"{script}:5: save-every-rank: warning:" in proc.stdout
    assert proc.stdout.rstrip().endswith("1 file checked: 1 finding (0 errors, 1 warning, 0 notes)")
