"""Opens every page of the built docs site in headless Chromium (Debian's package).

Serves ``docs/_build/html`` on a free loopback port and loads each page with
``chromium --headless --dump-dom``: the page must log nothing to the console (an error,
a failed load, a mermaid parse failure all log), every ``<pre class="mermaid">`` must
hold the SVG mermaid drew, and the page's ``data-mermaid`` mark must say "done" or
"none"; no file the page asks for may be missing (the server's 4xx answers). Screenshots
of the tutorial and of the session diagram go to ``docs-artifacts/``.

    python .ci/docs_browser.py [--html docs/_build/html] [--out docs-artifacts]

Exit 0 when every page passes; 1 with one line per failure otherwise.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import http.server
import re
import shutil
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE_TIMEOUT = 120
WORKERS = 2
"""Browsers at once (one per core of the CI machine)."""
SCREENSHOTS = {"tutorial.png": ("tutorial.html", "1200,2400"),
               "session-diagram.png": ("explanation/session-diagram.html", "1400,1800")}


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    sys.exit("no chromium on PATH: apt-get install -y chromium")


def _browser(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=20000", *extra, url],
        capture_output=True, text=True, timeout=PAGE_TIMEOUT, check=False)


_CONSOLE = re.compile(r":CONSOLE[:(]\d*\)?\] (.*)")
_MERMAID_BLOCK = re.compile(r'<pre class="mermaid"[^>]*>(.*?)</pre>', re.DOTALL)


MISSING: dict[str, list[str]] = {}
"""What the site's server answered with a 4xx, by the page that asked (its Referer)."""


def check_page(base: str, page: str) -> list[str]:
    """The problems of one page: console messages, missing files, undrawn diagrams."""
    ran = _browser(f"{base}/{page}", "--dump-dom")
    problems = [f"{page}: console: {m}" for m in _CONSOLE.findall(ran.stderr)]
    problems += [f"{page}: missing: {m}" for m in MISSING.pop(page, [])]
    dom = ran.stdout
    mark = re.search(r'data-mermaid="(\w+)"', dom)
    if mark is None or mark.group(1) not in ("done", "none"):
        problems.append(f"{page}: mermaid mark is {mark.group(1) if mark else 'missing'}")
    for i, block in enumerate(_MERMAID_BLOCK.findall(dom)):
        if "<svg" not in block or "Syntax error" in block:
            problems.append(f"{page}: diagram {i + 1} not drawn")
    if "<h1" not in dom:
        problems.append(f"{page}: no heading rendered (exit {ran.returncode})")
    return problems


class _Quiet(http.server.SimpleHTTPRequestHandler):
    """Serves the site silently, noting every 4xx answer in :data:`MISSING`."""

    def log_message(self, *_: object) -> None:
        pass

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if str(code).isdigit() and int(code) >= 400 and self.path != "/favicon.ico":
            page = urllib.parse.urlsplit(self.headers.get("Referer", "")).path.lstrip("/")
            MISSING.setdefault(page, []).append(f"{self.path} ({code})")


def serve(html: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """The site served on a free loopback port, from a thread; the server and its URL."""
    handler = functools.partial(_Quiet, directory=str(html))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--html", type=Path, default=ROOT / "docs" / "_build" / "html")
    ap.add_argument("--out", type=Path, default=ROOT / "docs-artifacts")
    args = ap.parse_args(argv)
    pages = sorted(str(p.relative_to(args.html)) for p in args.html.rglob("*.html")
                   if not p.relative_to(args.html).parts[0].startswith("_")
                   and p.name not in ("genindex.html", "search.html", "py-modindex.html"))
    server, base = serve(args.html)
    problems: list[str] = []
    try:
        with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
            for page, found in zip(pages, pool.map(lambda p: check_page(base, p), pages),
                                   strict=True):
                print(f"{'FAIL' if found else 'ok  '} {page}", flush=True)
                problems += found
        args.out.mkdir(parents=True, exist_ok=True)
        for name, (page, size) in SCREENSHOTS.items():
            shot = args.out / name
            _browser(f"{base}/{page}", f"--screenshot={shot}", f"--window-size={size}")
            if not shot.is_file() or shot.stat().st_size == 0:
                problems.append(f"{page}: no screenshot")
            else:
                print(f"screenshot {shot}")
    finally:
        server.shutdown()
        server.server_close()
    for line in problems:
        print(line)
    failing = len({p.split(":")[0] for p in problems})
    print(f"docs in headless Chromium: {len(pages) - failing} pages ok, {failing} failing")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
