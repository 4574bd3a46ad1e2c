"""The READMEs and the guide, as a newcomer reads them: README.md and README.zh-CN.md have the same sections, and
so has every page of docs/ and its zh-CN twin; the install section of each README names every extra of
pyproject.toml with what it installs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
READMES = [ROOT / "README.md", ROOT / "README.zh-CN.md"]


def _headings(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # a comment in a code block is no heading
    return [line.split()[0] for line in text.splitlines() if re.match(r"#{1,4} ", line)]


# Each English page with its Chinese twin: the READMEs, and every docs/X.md that has a docs/X.zh-CN.md.
PAIRS = [tuple(READMES)] + [(p, p.with_name(p.stem + ".zh-CN.md")) for p in sorted((ROOT / "docs").glob("*.md"))
                            if not p.stem.endswith(".zh-CN") and p.with_name(p.stem + ".zh-CN.md").exists()]


@pytest.mark.parametrize("english, chinese", PAIRS, ids=lambda p: p.name)
def test_a_page_and_its_translation_have_the_same_sections(english, chinese):
    assert _headings(english) == _headings(chinese)


def test_the_guide_pages_that_the_readme_held_have_their_twins():
    pages = {p.stem for p, _ in PAIRS}
    assert {"from-a-script", "launching", "failures", "security", "big-models", "observing"} <= pages


def _extras() -> dict[str, list[str]]:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


@pytest.mark.parametrize("readme", READMES, ids=lambda p: p.name)
def test_the_install_section_names_every_extra_and_what_it_installs(readme):
    text = readme.read_text()
    section = re.search(r"\n## (Install|安装)[^\n]*\n(.*?)\n## ", text, flags=re.S)
    assert section, f"{readme.name} has no install section"
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \| ([^|]+) \|", section.group(2), flags=re.M)}
    for extra, requirements in _extras().items():
        assert extra in rows, f"{readme.name}: the extra {extra!r} is not in the install table"
        for requirement in requirements:
            package = re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0]
            assert package in rows[extra], f"{readme.name}: {extra!r} installs {package}, not said"
    assert "download.pytorch.org/whl/cpu" in section.group(2)  # the CPU torch comes first


@pytest.mark.parametrize("readme", READMES, ids=lambda p: p.name)
def test_every_extra_a_readme_names_exists(readme):
    named = set(re.findall(r'ringtrain\[([\w,]+)\]', readme.read_text()))
    assert {extra for group in named for extra in group.split(",")} <= set(_extras())
