"""Pictures of the built site's pages as a reader's browser shows them: headless Chromium, on 127.0.0.1.

    python scripts/page_shots.py SITE_DIR OUT_DIR [PAGE ...]     (`make docs-shots`: the front page, the API page)

SITE_DIR is what `mkdocs build` wrote (`make docs`: site/); each PAGE is a path of the site ("" is the front page,
"api/" the API reference, "index.zh-CN/" the Chinese front page). The site is served from SITE_DIR on a free port
of 127.0.0.1 while Chromium (Debian's package `chromium`; `make docs-shots` installs it as root) takes one tall
picture of each page, cut into screens of 1400x1600 (OUT_DIR/<page>-N.png): look at them after changing a page's
layout — a signature on one 1,200-character line, a wall of text — before a user does.
"""

from __future__ import annotations

import functools
import http.server
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

WIDTH, SCREEN, SCREENS = 1400, 1600, 4
# As the machine's notes start it: no sandbox as root, and no background connections (this network refuses them).
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    sys.exit("page_shots: no Chromium on this machine\nHINT: apt-get install chromium (make docs-shots does, as root)")


def shoot(browser: str, url: str, out: Path, name: str) -> list[Path]:
    from PIL import Image  # matplotlib's dependency: in the venv with the bench extra

    tall = out / f"{name}-page.png"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}", f"--window-size={WIDTH},{SCREEN * SCREENS}",
                        f"--screenshot={tall}", url], check=True, capture_output=True, timeout=120)
    image, made = Image.open(tall), []
    for i in range(SCREENS):
        made.append(out / f"{name}-{i + 1}.png")
        image.crop((0, i * SCREEN, WIDTH, (i + 1) * SCREEN)).save(made[-1])
    tall.unlink()
    return made


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *_):  # one line per request: noise here
        pass


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    site, out = Path(argv[0]), Path(argv[1])
    if not (site / "index.html").is_file():
        sys.exit(f"page_shots: {site}/index.html is missing\nHINT: build the site first: make docs")
    out.mkdir(parents=True, exist_ok=True)
    browser = chromium()
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for page in argv[2:] or ["", "api/"]:
            name = page.strip("/").replace("/", "-") or "index"
            for png in shoot(browser, f"http://127.0.0.1:{server.server_port}/{page}", out, name):
                print(png)
    finally:
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
