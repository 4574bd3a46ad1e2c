"""Pictures of guide pages as a reader sees them: Markdown -> HTML -> PDF (WeasyPrint) -> PNG (pdfium).

    python scripts/page_shots.py OUT_DIR PAGE.md [PAGE.md ...]   (`make docs-shots`: README.md and docs/api.md)

Needs ``markdown``, ``weasyprint`` and ``pypdfium2`` (`make docs-shots` installs them into the venv; nothing else
uses them). The CSS is close to GitHub's reading width, not a copy of it: the point is to look at a page's
layout — a signature on one 1,200-character line, a wall of text — before a user does. Chinese glyphs show as
boxes where the machine has no CJK font (a font matter, not the page's).
"""

from __future__ import annotations

import sys
from pathlib import Path

CSS = """@page { size: 900px 1300px; margin: 30px; } body { font-family: sans-serif; font-size: 13px; line-height: 1.45 }
code, pre { font-family: monospace; background: #f4f4f4 } pre { padding: 8px; white-space: pre-wrap }
table { border-collapse: collapse } td, th { border: 1px solid #ccc; padding: 3px 6px }
h1, h2 { border-bottom: 1px solid #ddd }"""


def shoot(page: Path, out: Path, pages: int = 2) -> list[Path]:
    import markdown
    import pypdfium2
    import weasyprint

    html = markdown.markdown(page.read_text(encoding="utf-8"), extensions=["tables", "fenced_code", "toc"])
    pdf_path = out / f"{page.stem}.pdf"
    weasyprint.HTML(string=f"<html><head><meta charset='utf-8'><style>{CSS}</style></head><body>{html}</body>"
                           "</html>").write_pdf(pdf_path)
    pdf, made = pypdfium2.PdfDocument(str(pdf_path)), []
    for i in range(min(pages, len(pdf))):
        made.append(out / f"{page.stem}-{i + 1}.png")
        pdf[i].render(scale=1).to_pil().save(made[-1])
    return made


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for page in argv[1:]:
        for png in shoot(Path(page), out):
            print(png)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
