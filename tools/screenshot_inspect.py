"""Render an ``ember inspect --stages --html`` page in headless Chromium and save a PNG.

A way to look at the page as a browser draws it (layout, colours, readability) without a
display, e.g. when changing ``ember/inspect/layout.py``:

    python tools/screenshot_inspect.py page.html /tmp/page.png
    python tools/screenshot_inspect.py page.html /tmp/graph.png --graph-only --scale 0.5
    python tools/screenshot_inspect.py model.onnx /tmp/page.png --dim N=1   # runs inspect first

``--graph-only`` screenshots just the SVG of the compiled graph (cut out of the page into a
temporary one, scaled by ``--scale``, the window as large as the drawing up to
``--max-size``); otherwise the window is ``--window-size``, showing the top of the page or,
with ``--section``, of one of its sections.  Chromium runs with a throw-away profile, no
network services, no GPU and no sandbox (containers often lack the namespaces it needs).
Write PNGs outside the repo.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars")
TIMEOUT_SECONDS = 180


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("page", type=Path, help="an --html page, or a model to inspect first")
    parser.add_argument("png", type=Path, help="the screenshot to write")
    parser.add_argument("--window-size", default="1600,1200", metavar="W,H")
    parser.add_argument("--section", choices=("graph", "passes", "kernels", "memory"),
                        help="screenshot only this section of the page")
    parser.add_argument("--graph-only", action="store_true",
                        help="screenshot the whole graph drawing, nothing else")
    parser.add_argument("--scale", type=float, default=1.0, help="with --graph-only")
    parser.add_argument("--max-size", type=int, default=16000,
                        help="with --graph-only: the largest window side, in pixels")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                        help="for a model: passed to ember inspect")
    parser.add_argument("--chromium", help="the browser binary (default: found on PATH)")
    args = parser.parse_args(argv)

    browser = args.chromium or next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)
    if browser is None:
        print("error: no Chromium found; install it (apt-get install chromium) or pass "
              "--chromium", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ember-screenshot-") as tmp:
        work = Path(tmp)
        page = args.page.resolve()
        if page.suffix.lower() not in (".html", ".htm"):
            page = _inspect_to_html(page, work / "page.html", args.dim)
        window, url = args.window_size, page.as_uri()
        if args.graph_only:
            page, window = _graph_page(page, work / "graph.html", args.scale, args.max_size)
            url = page.as_uri()
        elif args.section:  # (a #fragment URL scrolls too late for headless screenshots)
            url = _section_page(page, work / "section.html", args.section).as_uri()
        args.png.parent.mkdir(parents=True, exist_ok=True)
        command = [browser, *CHROMIUM_FLAGS, f"--user-data-dir={work / 'profile'}",
                   f"--window-size={window}", f"--screenshot={args.png.resolve()}", url]
        result = subprocess.run(command, capture_output=True, text=True,
                                timeout=TIMEOUT_SECONDS)
        if result.returncode != 0 or not args.png.exists():
            print(f"error: chromium failed ({result.returncode}):\n{result.stderr[-2000:]}",
                  file=sys.stderr)
            return 1
    print(f"wrote {args.png} ({window.replace(',', 'x')} window)")
    return 0


def _inspect_to_html(model: Path, out: Path, dims: list[str]) -> Path:
    command = [sys.executable, "-m", "ember.cli", "inspect", str(model), "--stages", "--no-ir",
               "--html", str(out)]
    for dim in dims:
        command += ["--dim", dim]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return out


def _section_page(page: Path, out: Path, section: str) -> Path:
    """A page of one section of ``page``, with its stylesheet."""
    text = page.read_text(encoding="utf-8")
    head = re.search(r"<head>.*?</head>", text, re.S)
    body = re.search(rf'<section id="{section}">.*?</section>', text, re.S)
    if head is None or body is None:
        raise SystemExit(f"error: {page} has no section '{section}'")
    out.write_text(f"<!DOCTYPE html><html>{head.group()}<body>{body.group()}</body></html>",
                   encoding="utf-8")
    return out


def _graph_page(page: Path, out: Path, scale: float, max_size: int) -> tuple[Path, str]:
    """A page of only the graph's SVG, scaled; and the window size that shows all of it."""
    text = page.read_text(encoding="utf-8")
    match = re.search(r'<svg[^>]*class="graph".*?</svg>', text, re.S)
    if match is None:
        raise SystemExit(f"error: {page} has no graph drawing")
    svg = match.group()
    width = float(re.search(r'width="([\d.]+)"', svg).group(1)) * scale
    height = float(re.search(r'height="([\d.]+)"', svg).group(1)) * scale
    svg = re.sub(r'width="[\d.]+" height="[\d.]+"',
                 f'width="{width:.0f}" height="{height:.0f}"', svg, count=1)
    out.write_text(f'<!DOCTYPE html><html><head><meta charset="utf-8"><style>body{{margin:0;'
                   f'background:#fff}}</style></head><body>{svg}</body></html>',
                   encoding="utf-8")
    size = f"{min(int(width) + 1, max_size)},{min(int(height) + 1, max_size)}"
    return out, size


if __name__ == "__main__":
    sys.exit(main())
