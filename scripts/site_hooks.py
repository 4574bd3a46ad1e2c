"""MkDocs hooks: the guide as a website, built from the same files a reader finds on the repository.

    mkdocs build --strict        (`make docs`; mkdocs.yml names this file under `hooks:`)

The pages stay where they are — README.md, README.zh-CN.md and docs/*.md — and keep the links that work on the
repository; here they are put in the site's shape, with nothing copied or committed twice:

- README.md is the site's front page (index.md) and README.zh-CN.md its Chinese one (index.zh-CN.md);
- the navigation is the README's guide map — its table, in its order, for each language — and the rest of docs/
  under "Reference";
- a link that leaves docs/ (``../examples/digits.py``, ``../tests/seeds``) leads to a page of the site that shows
  that file (``source/examples/digits.py/``) or lists that folder, so the site needs no repository host to link to;
- a link from a README into docs/ (``docs/ring.md``) drops the ``docs/``.

`tests/test_site.py` builds the site with warnings as errors and follows every link of the built pages.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
READMES = {"index.md": ROOT / "README.md", "index.zh-CN.md": ROOT / "README.zh-CN.md"}
LINK = re.compile(r"(\[[^\]]*\]\()([^)\s]+)(\))")
CODE = re.compile(r"(?ms)^```.*?^```|`[^`\n]*`")  # a fenced block or an inline code span: left as it is
GUIDE_ROW = re.compile(r"(?m)^\| \[([^\]]+)\]\(docs/([^)#]+\.md)\)")
SOURCE = "source"
LANGUAGES = {
    "index.md": ("English", "Reference"),
    "index.zh-CN.md": ("中文", "参考"),
}
LEXERS = {".py": "python", ".sh": "bash", ".toml": "toml", ".yml": "yaml", ".yaml": "yaml", ".md": "markdown"}


def repo_path(src_uri: str) -> Path:
    """Where a page of the site lives in the repository."""
    if src_uri in READMES:
        return READMES[src_uri]
    return DOCS / src_uri


def site_uri(target: Path) -> str | None:
    """The site's file for a path of the repository, or None when it is outside the repository or missing."""
    if not target.is_relative_to(ROOT) or not target.exists():
        return None
    for uri, readme in READMES.items():
        if target == readme:
            return uri
    if target == DOCS:
        return "index.md"
    if target.is_relative_to(DOCS):
        return target.relative_to(DOCS).as_posix()
    relative = target.relative_to(ROOT).as_posix()
    return f"{SOURCE}/{relative}/index.md" if target.is_dir() else f"{SOURCE}/{relative}.md"


def _links(text: str) -> list[re.Match]:
    """The Markdown links of a text that are not code (a link's own text may hold a code span)."""
    code = [m.span() for m in CODE.finditer(text)]
    return [m for m in LINK.finditer(text) if not any(start <= m.start() < end for start, end in code)]


def _relative(uri: str, from_uri: str) -> str:
    """``uri`` as a link written in the page ``from_uri`` (both the site's source paths)."""
    depth = from_uri.count("/")
    return "../" * depth + uri


def links_of(page: Path) -> list[Path]:
    """The repository paths a page's relative links lead to."""
    targets = [m.group(2) for m in _links(page.read_text(encoding="utf-8"))]
    return [(page.parent / t.partition("#")[0]).resolve() for t in targets if _relative_link(t)]


def _relative_link(target: str) -> bool:
    return not re.match(r"[a-z]+:", target) and not target.startswith("#")


def rewrite(text: str, page: Path, uri: str) -> str:
    """A page's links, written for the site: each relative link to where its target is on the site."""
    out, at = [], 0
    for match in _links(text):
        file, hash_, fragment = match.group(2).partition("#")
        goes = site_uri((page.parent / file).resolve()) if _relative_link(match.group(2)) else None
        if goes is not None:  # else left as it is: a URL, an anchor of this page, or a link to nothing (reported)
            out.append(text[at:match.start(2)] + _relative(goes, uri) + hash_ + fragment)
            at = match.end(2)
    return "".join(out) + text[at:]


def _source_page(target: Path) -> str:
    relative = target.relative_to(ROOT).as_posix()
    if target.is_dir():
        rows = [f"- [`{child.name}{'/' if child.is_dir() else ''}`]({child.name}{'/index' if child.is_dir() else ''}.md)"
                for child in sorted(target.iterdir()) if _shown(child)]
        return f"# `{relative}/`\n\n" + "\n".join(rows) + "\n"
    text = target.read_text(encoding="utf-8")
    fence = "````" if "```" in text else "```"
    return f"# `{relative}`\n\n{fence}{LEXERS.get(target.suffix, 'text')}\n{text.rstrip()}\n{fence}\n"


def _shown(path: Path) -> bool:
    return not path.name.startswith((".", "__")) and (path.is_dir() or path.suffix in LEXERS)


def _sources(pages: list[Path]) -> list[Path]:
    """Every file and folder outside docs/ that a page links to, and what a listed folder holds."""
    todo = [t for page in pages for t in links_of(page) if (site_uri(t) or "").startswith(f"{SOURCE}/")]
    seen: set[Path] = set()
    while todo:
        target = todo.pop()
        if target not in seen:
            seen.add(target)
            if target.is_dir():
                todo.extend(child for child in target.iterdir() if _shown(child))
    return sorted(seen)


def on_config(config):
    config["nav"] = nav()
    try:  # the search's Chinese word cutter: its start-up lines ("Loading model cost 1.17 seconds.") are noise here
        import jieba

        jieba.setLogLevel(logging.WARNING)
    except ImportError:
        pass
    return config


def nav() -> list:
    """Each language's guide map, from its README's table, then its other pages of docs/ under "Reference" (in
    Chinese also the pages written in English only, as its README links them: architecture.md, benchmarks.md)."""
    sections = []
    for uri, (title, reference) in LANGUAGES.items():
        zh = uri != "index.md"
        readme = READMES[uri].read_text(encoding="utf-8")
        guide = [{name.replace("`", ""): page} for name, page in GUIDE_ROW.findall(readme)]
        named = {page for entry in guide for page in entry.values()}
        rest = sorted(p.name for p in DOCS.glob("*.md") if p.name not in named and (
            p.name.endswith(".zh-CN.md") == zh or (zh and not p.with_suffix(".zh-CN.md").exists())))
        home = {"首页" if zh else "Home": uri}
        sections.append({title: [home, *guide, {reference: rest}]})
    return sections


def on_files(files, config):
    for uri, readme in READMES.items():
        files.append(File.generated(config, uri, abs_src_path=str(readme)))
    pages = [*READMES.values(), *DOCS.glob("*.md")]
    for target in _sources(pages):
        files.append(File.generated(config, site_uri(target), content=_source_page(target)))
    return files


def on_page_markdown(markdown, page, config, files):
    uri = page.file.src_uri
    if uri.startswith(f"{SOURCE}/"):
        return markdown  # a file's own text, shown as it is
    return rewrite(markdown, repo_path(uri), uri)
