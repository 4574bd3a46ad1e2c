"""The guide as a website (`make docs`): MkDocs builds it from README.md, README.zh-CN.md and docs/ with warnings as
errors (mkdocs.yml, scripts/site_hooks.py), and what it built holds together: every link of every built page leads
to a page or file of the site and, with a #fragment, to an element of it; the front pages are the READMEs; the menu
is the README's guide map in each language; every public name has its entry on the API page."""

from __future__ import annotations

import html
import html.parser
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from _scripts import script

pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]' (make install does)")
pytest.importorskip("material", reason="the docs extra is not installed: pip install -e '.[docs]' (make install does)")

ROOT = Path(__file__).resolve().parent.parent


class _Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()
        self.nav: list[str] = []
        self.loads: list[str] = []  # what a browser fetches to show the page: scripts, styles, fonts, pictures
        self._in_nav = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag == "nav" and "md-nav--primary" in (attrs.get("class") or ""):
            self._in_nav = 1
        elif tag == "nav" and self._in_nav:
            self._in_nav += 1
        if (tag in ("script", "img") and attrs.get("src")) or (tag == "link" and attrs.get("rel") != "canonical"
                                                              and attrs.get("href")):
            self.loads.append(attrs.get("src") or attrs["href"])
        for key in ("href", "src"):
            if attrs.get(key):
                self.links.append(attrs[key])
                if key == "href" and self._in_nav and tag == "a":
                    self.nav.append(attrs[key])

    def handle_endtag(self, tag):
        if tag == "nav" and self._in_nav:
            self._in_nav -= 1


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said
    assert "WARNING" not in said, said
    return out


def _target(site: Path, page: Path, link: str) -> tuple[Path | None, str]:
    parts = urlsplit(link)
    if parts.scheme or parts.netloc or link.startswith("//"):
        return None, ""  # a URL of another site (Material links its own fonts nowhere: checked below)
    path = unquote(parts.path)
    if path.startswith("/"):  # 404.html's links, from the site's root wherever the page is served
        target = (site / path.lstrip("/")).resolve()
    else:
        target = page if not path else (page.parent / path).resolve()
    if target.is_dir():
        target = target / "index.html"
    return target, unquote(parts.fragment)


def test_every_link_of_the_built_site_resolves(site):
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 40, [p.relative_to(site) for p in pages]
    parsed = {p: _parse(p) for p in pages}
    broken = []
    for page, seen in parsed.items():
        for link in seen.links:
            target, fragment = _target(site, page, link)
            if target is None:
                continue
            where = f"{page.relative_to(site)} -> {link}"
            if not target.is_relative_to(site.resolve()) or not target.exists():
                broken.append(f"{where} (no such file)")
            elif fragment and target.suffix == ".html" and fragment not in parsed[target].ids:
                broken.append(f"{where} (no element #{fragment})")
    assert not broken, "\n".join(broken)


def test_the_site_asks_nothing_of_another_host(site):
    """No font, script or style from a CDN (Material's Google fonts are off: mkdocs.yml): the site reads the same
    offline and behind a firewall."""
    fetched = {link for page in site.rglob("*.html") for link in _parse(page).loads if urlsplit(link).scheme}
    assert not fetched, fetched


def test_the_front_pages_are_the_readmes_and_the_menu_is_the_guide_map(site):
    for html_page, readme in (("index.html", "README.md"), ("index.zh-CN/index.html", "README.zh-CN.md")):
        text = (site / html_page).read_text(encoding="utf-8")
        assert "make demo" in text and "make test" in text, html_page
        guide = re.findall(r"(?m)^\| \[[^\]]+\]\(docs/([^)#]+)\.md\)", (ROOT / readme).read_text(encoding="utf-8"))
        assert len(guide) >= 15, guide
        menu = [unquote(link).strip("./").removesuffix("/") for link in _parse(site / html_page).nav]
        for page in guide:
            assert page in menu, f"{page} is in {readme}'s guide map but not in the site's menu"


def test_every_public_name_has_its_entry_on_the_api_page(site):
    generator = script("api_reference")
    api = _parse(site / "api" / "index.html")
    headings = re.findall(r'<h3 id="([^"]+)">(.*?)<a', (site / "api" / "index.html").read_text(encoding="utf-8"))
    shown = {re.sub(r"<[^>]+>", "", text).strip() for _, text in headings}
    names = [e.name for _, _, entries in generator.sections() for e in entries]
    assert len(names) >= 150
    assert not [n for n in names if n not in shown], "public names without an entry on the site's API page"
    assert all(anchor in api.ids for anchor, _ in headings)


def test_a_file_the_guide_links_to_has_a_page_of_its_own(site):
    """README's [examples/digits.py](examples/digits.py) leads to a page showing the file; a folder to its list."""
    digits = (site / "source" / "examples" / "digits.py" / "index.html").read_text(encoding="utf-8")
    text = html.unescape(re.sub(r"<[^>]+>", "", digits))
    assert "ring.loader(" in text and (ROOT / "examples" / "digits.py").read_text().splitlines()[0] in text
    seeds = _parse(site / "source" / "tests" / "seeds" / "index.html")
    assert any("seed000_dataparallel.py" in link for link in seeds.links)
    front = _parse(site / "index.html").links
    assert "source/examples/digits.py/" in front, [link for link in front if "digits" in link]


def test_a_chinese_word_is_found_by_the_site_search(site):
    """Material's search splits text at its separator; Chinese has no spaces, so without jieba's cut (the docs extra)
    a Chinese page is one token per sentence and a search for 恢复 (resume) finds nothing."""
    index = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))
    separator = re.compile(index["config"]["separator"])
    tokens = {t for entry in index["docs"] if entry["location"].startswith("exact-resume.zh-CN/")
              for t in separator.split(re.sub(r"<[^>]+>", " ", entry["text"])) if t}
    assert {"恢复", "检查点"} <= tokens, sorted(tokens)[:40]
