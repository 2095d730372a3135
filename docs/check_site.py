"""Check the built site in headless Chromium, the way a reader meets it.

Serves the site on 127.0.0.1 and, for every page: HTTP 200, one H1, no page errors, no nbdev directive or export
plumbing shown, no code block wider than its box at 1280 px, no figure (an inline SVG, or an SVG shown by an <img>) whose
text renders below 11 CSS px at 1280 px, every internal link (and its #anchor) resolves, no
link points at a page the site lacks, and no request leaves 127.0.0.1 unless allow-listed; then checks that the search page finds something. Saves a screenshot of the front
page. Usage: `python docs/check_site.py [--site _site] [--screenshot _build/front-page.png]`.
"""
from __future__ import annotations

import argparse, functools, http.server, re, sys, threading
from pathlib import Path
from urllib.parse import urldefrag, urlparse

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
ALLOWED_SCHEMES = {"data", "blob", "about"}  # never leave the machine
ALLOWED_HOSTS: set[str] = set()              # the explicit allow-list of outside hosts: empty
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
PUBLISHED = "https://kvref.github.io/kvref/"  # nbdev's doc links: build.py points each at a page of the site
# Code blocks wider than their box at 1280 px: [overflow in px, first 60 characters of the widest line].
OVERFLOWING = """els => els.filter(e => e.scrollWidth > e.clientWidth + 1).map(e => [e.scrollWidth - e.clientWidth,
    e.innerText.split('\\n').reduce((a, b) => b.length > a.length ? b : a, '').slice(0, 60)])"""
MIN_FIGURE_TEXT_PX = 11  # the smallest text a figure may show at 1280 px (kvref.pictures draws at 11 px and up)
# Every SVG figure in the article, and the smallest size (CSS px) its text renders at: an inline <svg> is measured in
# place; an <img> showing an .svg is fetched, laid out off-screen at the size the <img> has, measured and removed.
# A text's size on screen is its computed font-size times the scale of its screen transform (viewBox and transforms);
# text that matplotlib drew as glyph paths (its default, svg.fonttype "path") is sized from the glyph group's scale.
FIGURE_TEXT = """async () => {
  const measure = svg => {
    let least = Infinity, sample = '';
    for (const t of svg.querySelectorAll('text')) {
      const words = t.textContent.trim();
      if (!words || getComputedStyle(t).display === 'none') continue;
      const m = t.getScreenCTM();
      if (!m) continue;
      const px = parseFloat(getComputedStyle(t).fontSize) * Math.sqrt(Math.abs(m.a * m.d - m.b * m.c));
      if (px < least) { least = px; sample = words.slice(0, 40); }
    }
    for (const g of svg.querySelectorAll('g[id^="text_"]')) {  // matplotlib's text as glyph paths: <use>s in a
      const glyphs = g.querySelector('use');                     // group scaled by font size / 100
      const m = glyphs && glyphs.parentElement.getScreenCTM();
      if (!m) continue;
      const px = 100 * Math.sqrt(Math.abs(m.a * m.d - m.b * m.c));
      const note = [...g.childNodes].find(n => n.nodeType === Node.COMMENT_NODE);
      if (px < least) { least = px; sample = note ? note.nodeValue.trim().slice(0, 40) : g.id; }
    }
    return [least, sample];
  };
  const out = [];
  const inline = [...document.querySelectorAll('article svg')].filter(s => s.querySelector('text') && !s.parentElement.closest('svg'));
  inline.forEach((svg, i) => out.push([`inline svg ${i + 1}` + (svg.id ? ` #${svg.id}` : ''), ...measure(svg)]));
  const images = [...document.querySelectorAll('article img')].filter(im => /\\.svg($|[?#])/i.test(im.getAttribute('src') || ''));
  for (const [i, im] of images.entries()) {
    const box = im.getBoundingClientRect();
    const name = `figure ${i + 1} (${im.getAttribute('src')})`;
    if (box.width === 0 || box.height === 0) continue;  // not shown at this width
    const text = await (await fetch(im.src)).text();
    const svg = new DOMParser().parseFromString(text, 'image/svg+xml').documentElement;
    if (svg.nodeName !== 'svg') { out.push([name, -1, 'not an SVG document']); continue; }
    const holder = document.createElement('div');
    holder.style.cssText = `position:absolute; left:-20000px; top:0; width:${box.width}px; height:${box.height}px`;
    const placed = document.importNode(svg, true);
    placed.setAttribute('width', box.width); placed.setAttribute('height', box.height);
    holder.appendChild(placed); document.body.appendChild(holder);
    out.push([name, ...measure(placed)]);
    holder.remove();
  }
  return out;
}"""


def small_figure_text(page, least: float = MIN_FIGURE_TEXT_PX) -> list[str]:
    "The figures on `page` (a loaded Playwright page) whose smallest text renders below `least` CSS px, described."
    found = []
    for name, px, sample in page.evaluate(FIGURE_TEXT):
        if px is not None and px < least:
            found.append(f"{name}: not an SVG document" if px < 0 else
                         f"{name} renders text at {px:.1f} px (below {least} px): {sample!r}")
    return found


SKIP_PAGES = {"genindex.html", "search.html", "py-modindex.html"}  # Sphinx's own pages have no chapter H1


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    "Serve `site` on a free port of 127.0.0.1 in a background thread."
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args): pass
    handler = functools.partial(Quiet, directory=str(site))
    class Server(http.server.ThreadingHTTPServer):
        def handle_error(self, request, client_address): pass  # the browser dropping a connection mid-load
    server = Server(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}/"


def check(site: Path, screenshot: Path) -> list[str]:
    "Visit every page of `site`; returns the problems found (empty when the site passes)."
    from playwright.sync_api import sync_playwright
    server, base = serve(site)
    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html")
                   if not p.relative_to(site).as_posix().startswith("_"))
    problems: list[str] = []
    ids: dict[str, set[str]] = {}
    links: list[tuple[str, str]] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        current = {"name": ""}

        def route(r):
            url = urlparse(r.request.url)
            if url.scheme in ALLOWED_SCHEMES or url.hostname == "127.0.0.1" or url.hostname in ALLOWED_HOSTS:
                return r.continue_()
            problems.append(f"{current['name']}: request leaves 127.0.0.1: {r.request.url}")
            r.abort()
        page.route("**/*", route)
        page.on("pageerror", lambda e: problems.append(f"{current['name']}: page error: {e}"))
        for name in pages:
            current["name"] = name
            response = page.goto(base + name, wait_until="load")
            if response is None or response.status != 200:
                problems.append(f"{name}: HTTP {response.status if response else 'no response'}")
                continue
            ids[name] = set(page.eval_on_selector_all("[id]", "els => els.map(e => e.id)"))
            if name not in SKIP_PAGES:
                h1 = page.eval_on_selector_all("article h1", "els => els.map(e => e.textContent.trim())")
                if len(h1) != 1: problems.append(f"{name}: expected one H1 in the article, found {h1}")
                code = "\n".join(page.eval_on_selector_all("div.cell_input", "els => els.map(e => e.innerText)"))
                if re.search(r"^\s*#\|", code, re.M) or "nbdev_export()" in code:  # markers and plumbing stay hidden
                    problems.append(f"{name}: a code cell shows an nbdev directive or the export call")
                wide = page.eval_on_selector_all("article pre", OVERFLOWING)
                for width, text in wide[:3]:
                    problems.append(f"{name}: a code block overflows the page by {width} px: {text!r}")
                if len(wide) > 3: problems.append(f"{name}: {len(wide) - 3} more code blocks overflow")
                problems += [f"{name}: {figure}" for figure in small_figure_text(page)]
            for href in page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)"):
                if href.startswith(base): links.append((name, href[len(base):]))
                elif href.startswith(PUBLISHED) or ".html.md" in href:  # a doc link build.py could not place
                    problems.append(f"{name}: link to no page of this site: {href}")
            if name == "index.html":
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(screenshot), full_page=False)
        current["name"] = "search.html"
        page.goto(base + "search.html?q=block", wait_until="load")
        try: page.wait_for_selector("#search-results li", timeout=15_000)
        except Exception: problems.append("search.html: searching for 'block' found nothing")
        browser.close()
    server.shutdown()
    for origin, target in links:
        path, anchor = urldefrag(target)
        path = path.split("?")[0] or "index.html"
        if path.endswith("/"): path += "index.html"
        if not (site / path).is_file(): problems.append(f"{origin}: broken link to {target}")
        elif anchor and path in ids and anchor not in ids[path]:
            problems.append(f"{origin}: link to missing anchor {target}")
    print(f"site check: {len(pages)} pages, {len(links)} internal links, {len(problems)} problems")
    return problems


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", type=Path, default=ROOT / "_site")
    parser.add_argument("--screenshot", type=Path, default=ROOT / "_build" / "front-page.png")
    args = parser.parse_args()
    if not (args.site / "index.html").exists(): sys.exit(f"site check: no site at {args.site}; build it first")
    found = check(args.site, args.screenshot)
    for problem in found: print("  " + problem)
    sys.exit(1 if found else 0)
