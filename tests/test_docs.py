"""The guide as a reader finds it: docs/api.md is what the docstrings say, every public name has one, every relative
link of README.md, README.zh-CN.md and docs/ leads to a file (and, with a #fragment, to a heading of it), and every
page of docs/ can be reached from the README."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _scripts import script

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", ROOT / "README.zh-CN.md", *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _generator():
    return script("api_reference")


def test_the_api_reference_is_what_the_docstrings_say():
    generator = _generator()
    assert generator.PAGE.read_text() == generator.render(), (
        "docs/api.md is out of date: run .venv/bin/python scripts/api_reference.py")


def test_every_public_name_has_a_docstring():
    generator = _generator()
    names = [e.name for _, _, entries in generator.sections() for e in entries]
    for name in ("rt.Ring", "rt.Ring.setup", "rt.Ring.all_reduce", "rt.launch", "rt.spawn", "rt.split",
                 "rt.SyncBatchNorm", "rt.strategies.FSDP", "hvd.allreduce", "hvd.DistributedOptimizer",
                 "ringtrain run", "ringtrain consolidate"):
        assert name in names, f"{name} is not in the API reference"
    assert generator.missing() == []


def _text_outside_code(path: Path) -> str:
    text = re.sub(r"(?ms)^```.*?^```", "", path.read_text())  # a link in a code block is code
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (letters of any script kept), spaces to -."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"(?ms)^```.*?^```", "", path.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"(?m)^#{1,6} (.+)$", text)}


def _links(path: Path) -> list[tuple[Path | None, str]]:
    found = []
    for target in LINK.findall(_text_outside_code(path)):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file, _, fragment = target.partition("#")
        found.append(((path.parent / file).resolve() if file else path, fragment))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = []
    for target, fragment in _links(page):
        if not target.exists():
            broken.append(f"{target.relative_to(ROOT) if target.is_relative_to(ROOT) else target} (no such file)")
        elif fragment and target.suffix == ".md" and fragment not in _anchors(target):
            broken.append(f"{target.relative_to(ROOT)}#{fragment} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)} links to: " + "; ".join(broken)


def test_every_page_of_the_guide_is_reached_from_the_readme():
    seen, todo = set(), [ROOT / "README.md", ROOT / "README.zh-CN.md"]
    while todo:
        page = todo.pop()
        if page in seen or page.suffix != ".md" or not page.is_file():
            continue
        seen.add(page)
        todo.extend(target for target, _ in _links(page))
    unreached = [p.name for p in (ROOT / "docs").glob("*.md") if p.resolve() not in seen]
    assert not unreached, f"no link leads to docs/{', docs/'.join(sorted(unreached))}: add it to the README's guide map"


def test_the_readme_is_a_front_page():
    for readme in (ROOT / "README.md", ROOT / "README.zh-CN.md"):
        text = readme.read_text()
        assert len(text.splitlines()) <= 400, f"{readme.name} is {len(text.splitlines())} lines"
        assert "make demo" in text and "make test" in text
