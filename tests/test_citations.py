"""Docs that cannot drift (issue 38, item 2): every file a comment or docstring in src/ cites exists, and no comment
cites an issue by number (a reader of the repository cannot open one).

A citation is a path-like word ending in ``.py``/``.md``/``.sh`` in src/ringtrain's comments and docstrings. It
exists when it names a file of this repository (by its path from the repository root, from src/ringtrain, from the
citing file's folder, or — a bare name — any file of that name in the repository), a file of the installed torch
(``torch/distributed/run.py``), or one of the names below that stand for a user's file or a third-party one.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import torch

import ringtrain

SRC = Path(ringtrain.__file__).resolve().parent
ROOT = SRC.parents[1]
TORCH = Path(torch.__file__).resolve().parent.parent
STDLIB = Path(tokenize.__file__).resolve().parent
# Other projects' sources, cited for where a design comes from (Horovod's API, torch's own files).
THIRD_PARTY = ("horovod/", "torch/", "multiprocessing/", "rendezvous/", "doc/PERFORMANCE.md")
CITED = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[\w-]+\.(?:py|md|sh))\b")
# A user's script or a third party's file, named as an example: not files of ours.
NOT_OURS = {
    "train.py", "script.py", "main.py", "example.py", "train_gpt2.py", "old_train.py", "mnist.py", "setup.py",
    "pytorch_mnist.py", "multinode.py", "multigpu_torchrun.py", "models.py", "model.py", "launch.py",
    "horovod/torch/optimizer.py", "horovod/torch/__init__.py", "horovod/common/basics.py", "prepare.py",
    "run.py", "x.py", "a.py", "b.py", "other.py", "mypkg/train.py", "train_ddp.py", "conftest.py", "validate.py",
    "join.py", "elastic.py", "sitecustomize.py", "usercustomize.py", "fsdp.py", "train.sh", "./discover.sh",
    "scripts/train_ddp.py",
}
ISSUE = re.compile(r"\b[Ii]ssues? #?\d+")


def _texts(path: Path) -> list[tuple[int, str]]:
    """The comments and string literals (docstrings, messages) of a module, with their line numbers."""
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type in (tokenize.COMMENT, tokenize.STRING):
            found.append((tok.start[0], tok.string))
    return found


def _exists(name: str, here: Path, basenames: set[str]) -> bool:
    if name in NOT_OURS or name.startswith(THIRD_PARTY) or (STDLIB / name).is_file():
        return True
    if "/" not in name and any(TORCH.joinpath("torch").rglob(name)):
        return True  # a file of torch's, by its name (dynamic_rendezvous.py)
    candidates = [ROOT / name, SRC / name, here.parent / name, SRC.parent / name, TORCH / name]
    if any(c.is_file() for c in candidates):
        return True
    return "/" not in name and name in basenames


def _basenames() -> set[str]:
    names = set()
    for folder in ("src", "tests", "examples", "scripts", "docs", "benchmarks", ".ci"):
        names |= {p.name for p in (ROOT / folder).rglob("*") if p.is_file()}
    return names | {p.name for p in ROOT.iterdir() if p.is_file()}


def test_every_file_src_cites_exists():
    basenames = _basenames()
    missing = []
    for path in sorted(SRC.rglob("*.py")):
        if "doctor/rules" in str(path) or path.name == "names.py":
            continue  # doctor's rules quote users' scripts
        for line, text in _texts(path):
            for name in CITED.findall(text):
                if not _exists(name, path, basenames):
                    missing.append(f"{path.relative_to(ROOT)}:{line}: {name}")
    assert not missing, "\n".join(missing)


def test_no_comment_cites_an_issue_by_number():
    found = [f"{path.relative_to(ROOT)}:{line}: {m.group(0)}" for path in sorted(SRC.rglob("*.py"))
             for line, text in _texts(path) if text.startswith("#") or text.lstrip("rbuRBU").startswith(('"""', "'''"))
             for m in ISSUE.finditer(text)]
    assert not found, "\n".join(found)
